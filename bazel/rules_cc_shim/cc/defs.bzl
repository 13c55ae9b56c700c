"""The rules `@rules_cc//cc:defs.bzl` provides, as Bazel's built-in rules.

Bazel 4's C++ toolchain auto-configuration loads `@rules_cc//cc:defs.bzl`,
which a WORKSPACE build otherwise downloads. The rules it needs are built into
Bazel 4 to 7, so this repository forwards to them and the build stays offline.
"""

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)
