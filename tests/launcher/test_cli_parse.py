"""Command-line rule of the launcher (no processes started)."""

import pytest

from neural_arch.distributed.run.launch_config import LaunchConfig, parse_command_line


def parse(*argv, warnings=None):
    return parse_command_line(list(argv), warn=(warnings.append if warnings is not None else None))


def test_seed_001_command_options_after_script():
    cfg, target, rest = parse("train.py", "--nproc_per_node=4", "--nnodes=1", "--master_addr=localhost",
                              "--master_port=29500", "--backend=gloo")
    assert (cfg.nproc_per_node, cfg.nnodes, cfg.master_addr, cfg.master_port, cfg.backend) == (
        4, 1, "localhost", 29500, "gloo")
    assert target == "train.py" and rest == []


def test_options_before_script_and_both_spellings_and_forms():
    cfg, target, rest = parse("--nproc-per-node", "3", "--max_restarts=2", "--monitor-interval", "0.5",
                              "--standalone", "train.py", "--lr", "0.1")
    assert (cfg.nproc_per_node, cfg.max_restarts, cfg.monitor_interval, cfg.standalone) == (3, 2, 0.5, True)
    assert target == "train.py" and rest == ["--lr", "0.1"]


def test_first_unknown_argument_starts_the_script_args_and_late_options_warn():
    warnings = []
    cfg, _target, rest = parse("train.py", "--nproc_per_node=2", "--epochs", "3", "--backend", "mpi",
                              warnings=warnings)
    assert cfg.nproc_per_node == 2 and cfg.backend == "gloo"
    assert rest == ["--epochs", "3", "--backend", "mpi"]
    assert len(warnings) == 1 and "--backend" in warnings[0]


def test_double_dash_ends_launcher_options_silently():
    warnings = []
    cfg, target, rest = parse("train.py", "--nproc_per_node", "2", "--", "--nproc_per_node", "5",
                              warnings=warnings)
    assert cfg.nproc_per_node == 2 and rest == ["--nproc_per_node", "5"] and warnings == []
    cfg, target, rest = parse("--standalone", "--", "train.py", "--standalone")
    assert cfg.standalone and target == "train.py" and rest == ["--standalone"]


def test_module_mode():
    cfg, target, rest = parse("--nproc_per_node=2", "-m", "pkg.train", "--nnodes=1", "-m", "x")
    assert cfg.module and target == "pkg.train" and cfg.nnodes == 1 and rest == ["-m", "x"]


@pytest.mark.parametrize("argv, message", [
    ((), "no script given"),
    (("--bogus", "train.py"), "unknown launcher option '--bogus'"),
    (("--nproc_per_node",), "needs a value"),
    (("--nproc_per_node=two", "t.py"), "'two' is not a valid process count N, cpu, gpu or auto"),
    (("--standalone=1", "t.py"), "takes no value"),
    (("--nnodes=2", "--node_rank=2", "t.py"), "node_rank=2"),
    (("--standalone", "--nnodes=2", "t.py"), "single node"),
    (("-m",), "module name"),
])
def test_usage_errors_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--help")
    assert info.value.code == 0 and "--nproc_per_node" in capsys.readouterr().out


def test_config_validation_and_world_size():
    assert LaunchConfig(nproc_per_node=3, nnodes=2, node_rank=1).world_size == 6
    with pytest.raises(ValueError, match="nproc_per_node"):
        LaunchConfig(nproc_per_node=0)
    with pytest.raises(ValueError, match="monitor_interval"):
        LaunchConfig(monitor_interval=0)


def test_launch_distributed_training_rejects_unknown_options():
    from neural_arch.distributed.launcher import launch_distributed_training

    with pytest.raises(TypeError, match="nproc_per_nod"):
        launch_distributed_training("train.py", nproc_per_nod=2)


def test_multinode_restarts_are_elastic_and_need_the_job_token(monkeypatch):
    from neural_arch.distributed.launcher import DistributedLauncher

    monkeypatch.delenv("NEURAL_ARCH_AUTH_TOKEN", raising=False)
    config = LaunchConfig(nnodes=4, max_restarts=3)
    assert config.elastic and config.nnodes_spec == "4:4"
    with pytest.raises(ValueError, match="NEURAL_ARCH_AUTH_TOKEN"):
        DistributedLauncher(config).launch("train.py", "--epochs", "100")


@pytest.mark.parametrize("spec, bounds", [("3", (3, 3)), ("1:4", (1, 4)), ("2:2", (2, 2))])
def test_nnodes_takes_torchruns_min_max_form(spec, bounds):
    cfg, _target, _rest = parse(f"--nnodes={spec}", "--rdzv_last_call=0.5", "train.py")
    assert (cfg.min_nnodes, cfg.nnodes, cfg.rdzv_last_call) == (*bounds, 0.5)
    assert cfg.replace(node_rank=bounds[1] - 1).min_nnodes == bounds[0]  # replace() keeps MIN


@pytest.mark.parametrize("spec, message", [("3:2", "MIN <= MAX"), ("0:2", "MIN <= MAX"), ("x:2", "MIN:MAX")])
def test_bad_node_ranges_are_refused_at_parse_time(spec, message, capsys):
    with pytest.raises(SystemExit):
        parse(f"--nnodes={spec}", "train.py")
    assert message in capsys.readouterr().err


def test_mpi_backend_is_refused_with_the_mpiexec_command():
    from neural_arch.distributed.launcher import DistributedLauncher

    with pytest.raises(ValueError, match="mpiexec -n 4 python train.py"):
        DistributedLauncher(LaunchConfig(nproc_per_node=4, backend="mpi")).launch("train.py")


def test_options_taken_after_the_script_are_named_in_a_warning():
    warnings = []
    cfg, _target, rest = parse("train.py", "--nproc_per_node=2", "--backend", "gloo", "--lr", "1",
                              warnings=warnings)
    assert cfg.nproc_per_node == 2 and rest == ["--lr", "1"]
    assert len(warnings) == 1 and "took --nproc_per_node --backend after the script" in warnings[0]


def test_a_script_option_that_collides_is_not_eaten_after_an_unknown_one():
    warnings = []
    cfg, _target, rest = parse("--nproc_per_node=2", "train.py", "--epochs", "2", "--nnodes", "7",
                              warnings=warnings)
    assert cfg.nnodes == 1 and rest == ["--epochs", "2", "--nnodes", "7"]
    assert "--nnodes comes after the script argument '--epochs'" in warnings[0]


def test_torchrun_rendezvous_options_map_to_ours():
    cfg, target, rest = parse("--nnodes=2", "--node_rank=1", "--nproc-per-node=4", "--rdzv_backend", "c10d",
                              "--rdzv-endpoint", "node0:29400", "--rdzv_id", "job42", "train.py", "--x")
    assert (cfg.master_addr, cfg.master_port, cfg.rdzv_id, cfg.nproc_per_node) == ("node0", 29400, "job42", 4)
    assert target == "train.py" and rest == ["--x"]
    cfg, _, _ = parse("--rdzv_endpoint=10.0.0.1", "t.py")
    assert (cfg.master_addr, cfg.master_port) == ("10.0.0.1", 29400)


@pytest.mark.parametrize("argv, message", [
    (("--rdzv_backend=etcd", "t.py"), "use --rdzv_backend=c10d"),
    (("--rdzv_endpoint=h:x", "t.py"), "HOST:PORT"),
    (("--rdzv_endpoint=h:1", "--master_port=2", "t.py"), "contradicts --master_port=2"),
])
def test_torchrun_rendezvous_errors_say_what_to_write(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_torchruns_nproc_words_and_endpoints():
    """torchrun's --nproc_per_node words, a bracketed IPv6 endpoint without a port (torchrun's 29400),
    and a master port of 0 that only --standalone or a world of one can use."""
    import os

    from neural_arch.distributed.run.launch_config import _gpu_count

    gpus = _gpu_count()
    cfg, _, _ = parse_command_line(["--nproc_per_node", "cpu", "t.py"])
    assert cfg.nproc_per_node == (os.cpu_count() or 1)
    cfg, _, _ = parse_command_line(["--nproc_per_node=auto", "t.py"])     # GPUs if any, else CPU cores
    assert cfg.nproc_per_node == (gpus or os.cpu_count() or 1)
    cfg, _, _ = parse_command_line(["--rdzv_endpoint=[::1]", "t.py"])
    assert (cfg.master_addr, cfg.master_port) == ("::1", 29400)
    cfg, _, _ = parse_command_line(["--rdzv_endpoint=[::1]:1234", "t.py"])
    assert (cfg.master_addr, cfg.master_port) == ("::1", 1234)
    refused = [["--rdzv_endpoint= ", "t.py"], ["--master_port", "0", "--nproc_per_node", "2", "t.py"]]
    if not gpus:
        refused.append(["--nproc_per_node", "gpu", "t.py"])
    for argv in refused:
        with pytest.raises(SystemExit) as info:
            parse_command_line(argv)
        assert info.value.code == 2, argv
    cfg, _, _ = parse_command_line(["--master_port", "0", "t.py"])         # a world of one may
    assert cfg.master_port == 0

