"""The op table: every TF op disc_tf compiles is defined once, in one entry that
holds its support predicate (dtypes, constant and host-shape operands, checks)
and its lowering to DHLO (``table.tf_op``); an elementwise DHLO op holds its shape
rule (the operands' shape) and its C++/CUDA expression (``elementwise``). Adding a
TF op that is one DHLO elementwise op is one ``elementwise.elementwise_op`` line.
"""
