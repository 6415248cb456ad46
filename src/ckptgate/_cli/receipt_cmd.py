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
        help="PEM public key to check the receipt's DSSE signature with.",
    )
    @json_option
    def verify_command(dst: Path, key: Path | None, as_json: bool) -> int:
        """Check DST against its receipt: the signature when there is one (with --key), and every
        output file's sha256 and size; missing and extra files are reported.

        Exit 0 when everything matches; 5 on any mismatch, missing or extra file, or bad signature.
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
            stdout.print("receipt verified" if result.ok else "receipt does NOT match (exit 5)")
        return 0 if result.ok else 5
