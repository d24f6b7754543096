"""The package resolves torch-style submodules lazily (neural_arch.cuda like torch.cuda)."""
def test_torch_style_submodules_resolve_from_the_package():
    import neural_arch as na

    assert na.cuda.is_available() in (True, False)  # torch.cuda.is_available()
    assert hasattr(na.amp, "GradScaler") and hasattr(na.profiler, "events")
