"""The rules `@rules_java//java:defs.bzl` provides, as Bazel's built-in rules.

Only for loading `@bazel_tools//tools/jdk`, whose Java toolchains Bazel 4
registers for every build; nothing here builds Java, so nothing is fetched.
"""

def java_import(**attrs):
    native.java_import(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)
