"""``ckptgate receipt verify``: check a published destination against its receipt."""

from __future__ import annotations

from pathlib import Path

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, shown_line, stdout


def register(cli: click.Group) -> None:
    @cli.group("receipt")
    def receipt_group() -> None:
        """Receipt tools."""

    @receipt_group.command("verify")
    @click.argument("dst", type=UserPath(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--key",
        type=UserPath(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="PEM public key the receipt was signed with (intake --receipt-key); without it the signature "
        "is not checked and the run exits 5.",
    )
    @json_option
    def verify_command(dst: Path, key: Path | None, as_json: bool) -> int:
        """Check DST against its receipt: the receipt's signature with --key, and every output
        file's sha256 and size; missing and extra files are reported.

        Files that match the receipt beside them show only that the two agree: whoever edited the
        files could have rewritten the receipt. Only a signature that verifies with --key says who
        wrote it. Exit 0 when the signature verifies with --key and every file matches; 5 on any
        mismatch, missing or extra file, or a signature that is bad, missing, unsigned or not checked
        (no --key): `files_match` and `authenticated` in --json tell these apart.
        """
        from ckptgate.receipt import verify_receipt  # noqa: PLC0415 - ~1 s (cryptography)

        result = verify_receipt(dst, key=key)
        if as_json:
            emit_json(result.to_json())
        else:
            stdout.print(
                shown_line(
                    f"signature  {result.signature}"
                    + (f" ({result.signature_detail})" if result.signature_detail else "")
                )
            )
            engine = result.engine or {}
            if engine.get("kind") == "remote":
                revision = engine.get("revision")
                stdout.print(
                    shown_line(
                        f"engine     remote OPA {engine.get('url')}"
                        + (f" (bundle revision {revision})" if revision else " (no bundle revision reported)")
                    )
                )
            elif engine.get("kind") == "embedded":
                stdout.print(
                    shown_line(f"engine     embedded OPA {engine.get('opa_version') or '(version not recorded)'}")
                )
            for f in result.files:
                stdout.print(shown_line(f"{f.status:<15} {f.file}"))
            if result.ok:
                stdout.print(shown_line(f"receipt verified: signed by {key}, and every file matches it"))
            elif result.files_match and result.signature in ("unchecked", "absent"):
                stdout.print(
                    "files match the receipt beside them, but the receipt is NOT authenticated: "
                    + (
                        "its signature was not checked (no --key)"
                        if result.signature == "unchecked"
                        else "it is unsigned"
                    )
                    + ", so who wrote it is unknown and whoever edited the files could have rewritten it (exit 5)"
                )
            else:
                stdout.print("receipt does NOT match (exit 5)")
        return 0 if result.ok else 5
