"""A taken master port is named by the launcher before any rank starts, with --standalone suggested."""

from __future__ import annotations

import socket

from neural_arch.distributed import launcher
from neural_arch.distributed.run.child_env import port_taken


def test_a_taken_master_port_is_named_and_standalone_suggested(tmp_path, capsys):
    script = tmp_path / "never_started.py"
    marker = tmp_path / "started"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        assert port_taken("127.0.0.1", port)
        rc = launcher.main(["--nproc_per_node", "1", "--master_port", str(port), str(script)])
    err = capsys.readouterr().err
    assert rc == 1 and not marker.exists()
    assert f"master port {port} on 127.0.0.1 is taken" in err and "--standalone" in err
    assert not port_taken("127.0.0.1", port)      # free again once the holder closed
