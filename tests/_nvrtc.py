"""Whether NVRTC can compile here: cuda-python's binding imports AND libnvrtc loads."""


def nvrtc_available() -> bool:
    """True when ``nvrtcVersion()`` answers (it loads libnvrtc); a binding without the
    library (no nvidia-cuda-nvrtc wheel, no CUDA toolkit) is False."""
    try:
        from cuda.bindings import nvrtc

        err, major, _ = nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001  (ImportError, or the library failing to load)
        return False
    return err == nvrtc.nvrtcResult.NVRTC_SUCCESS and major >= 11
