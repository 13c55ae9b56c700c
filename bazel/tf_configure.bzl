"""`tf_configure`: the TensorFlow of a pip installation as a Bazel repository.

The op library is built against exactly the TensorFlow it will be loaded into:
the headers (`include/`) and `libtensorflow_framework.so.2` shipped in the
pip package. The repository rule asks a Python interpreter where that package
is ($DISC_TF_PYTHON_BIN, default `python3`) -- or takes $TF_PIP_DIR as is --
and links its files into the external repository, so nothing is downloaded.
"""

_BUILD = """
cc_library(
    name = "tf_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    visibility = ["//visibility:public"],
)

cc_import(
    name = "tf_framework_import",
    shared_library = "libtensorflow_framework.so.2",
    visibility = ["//visibility:public"],
)

cc_library(
    name = "tf_framework",
    deps = [":tf_framework_import"],
    visibility = ["//visibility:public"],
)
"""

_FIND_TF = "import os, tensorflow as tf; print(os.path.dirname(tf.sysconfig.get_lib() + '/'))"

def _tf_configure_impl(ctx):
    tf_dir = ctx.os.environ.get("TF_PIP_DIR", "")
    if not tf_dir:
        python = ctx.os.environ.get("DISC_TF_PYTHON_BIN", "python3")
        result = ctx.execute([python, "-c", _FIND_TF], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
        if result.return_code != 0:
            fail("tf_configure: cannot import tensorflow with %s (set DISC_TF_PYTHON_BIN " % python +
                 "or TF_PIP_DIR):\n" + result.stderr)
        tf_dir = result.stdout.strip().splitlines()[-1]
    for name in ["include", "libtensorflow_framework.so.2"]:
        src = ctx.path(tf_dir + "/" + name)
        if not src.exists:
            fail("tf_configure: %s has no %s; is it a TensorFlow pip package?" % (tf_dir, name))
        ctx.symlink(src, name)
    ctx.file("BUILD", _BUILD)
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = ["TF_PIP_DIR", "DISC_TF_PYTHON_BIN"],
    local = True,
)
