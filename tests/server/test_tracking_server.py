"""`attent server`'s command line: a file store or a taken port is refused in one line. The server serving, and
concurrent trials through it (every metric point, artifact and run status lands): the system tier's
tests/system/test_tracking_server.py."""

from __future__ import annotations

import socket

from attent.cli.main import main as attent_main


def test_server_refuses_a_file_store(tmp_path, capsys):
    assert attent_main(["server", "--backend-store-uri", str(tmp_path / "mlruns")]) == 2
    assert "file store, not a SQL database" in capsys.readouterr().err


def test_server_refuses_a_taken_port(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = attent_main(["server", "--backend-store-uri", f"sqlite:///{tmp_path}/m.db", "--port", str(port)])
    assert code == 2
    assert f"port {port} on 127.0.0.1 is taken" in capsys.readouterr().err
