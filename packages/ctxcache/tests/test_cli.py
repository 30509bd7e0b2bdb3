"""The qnnx-ctxcache command line: every command, --json output, exit codes, refusal to wipe non-caches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ctxcache_helpers import key_for

import qnnx_ctxcache as cc
from qnnx_ctxcache.__main__ import main, parse_size
from qnnx_ctxcache.testing import FakeBuild


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A cache root with two entries."""
    store = cc.ContextStore(tmp_path / "cache", options=cc.StoreOptions(min_age_seconds=0))
    for name in "ab":
        store.get_or_create(key_for(name), FakeBuild())
    return tmp_path / "cache"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    capsys.readouterr()  # drop what earlier commands printed
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_dir_prints_root(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dir --json` names the root and says whether it is a cache root."""
    assert _json(capsys, "--root", str(filled), "dir", "--json") == (0, {"root": str(filled), "is_cache_root": True})


def test_ls_and_stats_json(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ls --json` lists both entries with sizes; `stats --json` counts them."""
    code, listing = _json(capsys, "--root", str(filled), "ls", "--json")
    assert code == 0
    assert {e["key"] for e in listing["entries"]} == {key_for("a").hex, key_for("b").hex}  # type: ignore[index]
    assert all(e["size_bytes"] > 0 for e in listing["entries"])  # type: ignore[index]
    code, stats = _json(capsys, "--root", str(filled), "stats", "--json")
    assert (code, stats["entries"], stats["mode"]) == (0, 2, "readwrite")  # type: ignore[index]
    assert stats["totals"]["store"] == 2  # type: ignore[index]


def test_inspect_by_prefix_shows_key_material(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inspect PREFIX --json` shows the manifest with key material and files."""
    code, info = _json(capsys, "--root", str(filled), "inspect", key_for("a").hex[:8], "--json")
    assert code == 0
    assert info["key"] == key_for("a").hex  # type: ignore[index]
    assert info["key_material"]["model_digest"] == "sha256:a"  # type: ignore[index]
    assert {f["path"] for f in info["files"]} == {"model_ctx.onnx", "model_ctx_qnn.bin"}  # type: ignore[index]


def test_explain_lists_differing_key_fields(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`explain A B --json` names the key fields that differ between two entries."""
    code, result = _json(
        capsys, "--root", str(filled), "explain", key_for("a").hex[:10], key_for("b").hex[:10], "--json"
    )
    assert (code, result) == (0, {"differences": ["model_digest: 'sha256:a' != 'sha256:b'"]})
    missing = next(p for p in ("abcd", "bcde") if not key_for("a").hex.startswith(p))
    assert main(["--root", str(filled), "explain", missing, key_for("b").hex]) == 3


def test_verify_exit_codes(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`verify --full` exits 0 when clean and 1 after a byte flip; `--fix` quarantines the bad entry."""
    assert main(["--root", str(filled), "verify", "--full"]) == 0
    target = cc.ContextStore(filled).entry_dir(key_for("a")) / "model_ctx_qnn.bin"
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[5] ^= 1
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()
    assert main(["--root", str(filled), "verify"]) == 0  # cheap check cannot see a same-size, same-mtime flip
    code, report = _json(capsys, "--root", str(filled), "verify", "--full", "--json")
    assert (code, report["ok"], report["problems"][0]["reason"]) == (1, False, "corrupt:checksum")  # type: ignore[index]
    assert main(["--root", str(filled), "verify", "--full", "--fix"]) == 1
    assert main(["--root", str(filled), "verify", "--full"]) == 0


def test_prune_dry_run_then_real(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`prune --max-size 0 --dry-run` changes nothing; without --dry-run it empties the cache."""
    code, report = _json(
        capsys, "--root", str(filled), "prune", "--max-size", "0", "--min-age", "0", "--dry-run", "--json"
    )
    assert (code, len(report["removed"]), report["dry_run"]) == (0, 2, True)  # type: ignore[index]
    assert cc.ContextStore(filled).stats().entries == 2
    assert main(["--root", str(filled), "prune", "--max-size", "0", "--min-age", "0"]) == 0
    assert cc.ContextStore(filled).stats().entries == 0


def test_rm_and_clear(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rm KEY` removes one entry; `clear` removes the rest."""
    assert main(["--root", str(filled), "rm", key_for("a").hex]) == 0
    assert main(["--root", str(filled), "rm", key_for("a").hex]) == 3  # gone: no entry matches
    code, result = _json(capsys, "--root", str(filled), "clear", "--json")
    assert (code, result) == (0, {"removed": 1})


def test_clear_refuses_a_directory_without_marker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`clear` on a folder that is not a cache root exits 3 and deletes nothing, even a symlinked target."""
    victim = tmp_path / "home"
    (victim / "v1" / "entries").mkdir(parents=True)
    sentinel = tmp_path / "outside.txt"
    sentinel.write_text("keep")
    (victim / "v1" / "entries" / "link").symlink_to(sentinel)
    (victim / "precious.txt").write_text("keep")
    assert main(["--root", str(victim), "clear"]) == 3
    assert "not a qnnx-ctxcache root" in capsys.readouterr().err
    assert (victim / "precious.txt").read_text() == "keep"
    assert sentinel.read_text() == "keep"


def test_clear_does_not_follow_symlinks_out_of_the_cache(filled: Path, tmp_path: Path) -> None:
    """Deleting entries never follows a symlink planted inside the cache."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    entry_dir = cc.ContextStore(filled).entry_dir(key_for("a"))
    (entry_dir / "evil").symlink_to(outside)
    assert main(["--root", str(filled), "clear"]) == 0
    assert (outside / "keep.txt").read_text() == "keep"


@pytest.mark.parametrize("command", ["ls", "stats", "verify", "prune", "inspect abcd", "pack out.tar"])
def test_a_missing_root_is_an_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Reading or trimming a cache that does not exist exits 3, says so on stderr with the fix, creates nothing."""
    root = tmp_path / "nothing"
    capsys.readouterr()
    assert main(["--root", str(root), *command.split()]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert f"qnnx-ctxcache: error: cache root {root} does not exist" in err and "fix: pass --root" in err
    assert not root.exists() and not (tmp_path / "out.tar").exists()


def test_ls_on_a_regular_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ls` with --root naming a file exits 3 with a message saying it is a file, and a JSON error with --json."""
    afile = tmp_path / "afile"
    afile.write_text("not a cache")
    capsys.readouterr()
    assert main(["--root", str(afile), "ls", "--json"]) == 3
    out, err = capsys.readouterr()
    assert "is a file, not a directory" in err
    assert json.loads(out)["error"]["type"] == "NotACacheRootError"


def test_a_directory_without_the_marker_is_not_a_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ls` in an ordinary directory exits 3 naming the missing root marker."""
    assert main(["--root", str(tmp_path), "ls"]) == 3
    assert "is not a qnnx-ctxcache root" in capsys.readouterr().err


def test_key_prefixes_too_short_missing_and_ambiguous_get_distinct_messages(
    filled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inspect ab` is a usage error (exit 2, at least 4 hex digits); a prefix no key has, and one that several
    keys share, exit 3 with different messages (the ambiguous one lists the candidates)."""
    capsys.readouterr()
    assert main(["--root", str(filled), "inspect", "ab"]) == 2
    assert "at least 4 hex digits" in capsys.readouterr().err
    key = key_for("a").hex
    missing = next(p for p in ("abcd", "bcde") if not key.startswith(p) and not key_for("b").hex.startswith(p))
    assert main(["--root", str(filled), "inspect", missing]) == 3
    assert f"no entry under {filled} has a key starting with {missing!r}" in capsys.readouterr().err
    store = cc.ContextStore(filled)
    twin = key[:8] + ("0" if key[8] != "0" else "1") + key[9:]  # same first 8 digits, another key
    shutil.copytree(store.entry_dir(key), store.entry_dir(twin))
    assert main(["--root", str(filled), "inspect", key[:8]]) == 3
    err = capsys.readouterr().err
    assert f"{key[:8]!r} is ambiguous: 2 entries" in err and key[:16] in err and twin[:16] in err
    assert "fix: give more hex digits" in err


def test_json_errors_have_one_shape(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --json (before or after the command) every error is {"error": {type, message, fix, exit_code}} on
    stdout, and the human line is on stderr: a usage error, a missing entry, a bad archive."""
    bad_archive = filled.parent / "bad.tar"
    bad_archive.write_bytes(b"not a tar archive")
    cases = [
        (["--json", "prune", "--min-age", "-1"], 2),
        (["--root", str(filled), "--json", "inspect", "ffffffff"], 3),
        (["--root", str(filled), "inspect", "ffffffff", "--json"], 3),
        (["--root", str(filled), "unpack", str(bad_archive), "--json"], 3),
    ]
    for argv, code in cases:
        capsys.readouterr()
        assert main(argv) == code, argv
        out, err = capsys.readouterr()
        error = json.loads(out)["error"]
        assert set(error) == {"type", "message", "fix", "exit_code"} and error["exit_code"] == code
        assert err.startswith("usage:") or err.startswith("qnnx-ctxcache: error:")


def test_soc_model_filters_ls_and_pack_by_number_or_chip_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ls --soc-model SM8650` lists only entries whose key targets soc 57; `pack --soc-model 60` packs the other;
    a SoC no entry has is an error, an unknown chip name a usage error naming the accepted names."""
    store = cc.ContextStore(tmp_path / "cache", options=cc.StoreOptions(min_age_seconds=0))
    store.get_or_create(key_for("x", target={"soc_model": 57}), FakeBuild())
    store.get_or_create(key_for("y", target={"soc_model": 60}), FakeBuild())
    root = str(tmp_path / "cache")
    code, listing = _json(capsys, "--root", root, "ls", "--soc-model", "SM8650", "--json")
    assert code == 0
    assert [e["key"] for e in listing["entries"]] == [key_for("x", target={"soc_model": 57}).hex]  # type: ignore[index]
    code, packed = _json(capsys, "--root", root, "pack", str(tmp_path / "x.tar"), "--soc-model", "60", "--json")
    assert code == 0 and packed["entries"] == [key_for("y", target={"soc_model": 60}).hex]  # type: ignore[index]
    assert main(["--root", root, "pack", str(tmp_path / "z.tar"), "--soc-model", "SM8750"]) == 3
    capsys.readouterr()
    assert main(["--root", root, "ls", "--soc-model", "SM9999"]) == 2
    assert "SC8380XP" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown commands, bad sizes and a negative grace period exit with code 2, the message on stderr."""
    assert main(["frobnicate"]) == 2
    assert main(["prune", "--max-size", "lots"]) == 2
    assert main(["prune", "--min-age", "-1"]) == 2  # was a traceback
    assert "seconds >= 0" in capsys.readouterr().err
    assert parse_size("10GiB") == 10 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("0") == 0


def test_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 and shows example invocations and exit codes."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "qnnx-ctxcache verify --full" in out
    assert "exit codes" in out and "3  error: the cache root is missing" in out


def test_console_script_is_installed(filled: Path) -> None:
    """The qnnx-ctxcache entry point runs as a separate program."""
    exe = shutil.which("qnnx-ctxcache") or str(Path(os.sys.executable).parent / "qnnx-ctxcache")
    done = subprocess.run([exe, "--root", str(filled), "stats", "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entries"] == 2


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version and exits 0."""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"qnnx-ctxcache {cc.__version__}"
