"""The native build's stamp describes the sources the outputs were built from."""

from __future__ import annotations

import dataclasses
import pathlib

from disc_tf.runtime import native_build


def test_source_edited_during_the_build_leaves_the_outputs_stale(tmp_path, monkeypatch):
    source, header = tmp_path / "op.cc", tmp_path / "edited.h"
    source.write_text('#include "edited.h"\n')
    header.write_text("// before\n")
    monkeypatch.setattr(native_build, "REPO_ROOT", tmp_path)
    config = dataclasses.replace(native_build.make_config(), ops_sources=(source,),
                                 py_sources=(), headers=(header,))
    before = config.stamp()

    def fake_compiler(cmd: list[str]) -> None:
        header.write_text("// edited while the compiler ran\n")
        out = pathlib.Path(cmd[cmd.index("-o") + 1])
        out.write_bytes(b"\x7fELF")

    monkeypatch.setattr(native_build, "_run", fake_compiler)
    native_dir = tmp_path / "native"
    native_dir.mkdir()
    native_build._build(config, native_dir)
    assert (native_dir / native_build.STAMP_NAME).read_text().strip() == before
    assert not native_build.is_up_to_date(config, native_dir)  # the next build runs
    installed = native_build.include_dir(native_dir) / native_build.RAL_HEADER_NAME
    assert installed.read_bytes() == (
        native_build.CC_DIR / "ral" / native_build.RAL_HEADER_NAME).read_bytes()
