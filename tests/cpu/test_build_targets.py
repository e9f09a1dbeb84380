"""The installed native module must have been built for sm_90a: PTX for an older target would be JIT-compiled on
an H200 without the sm_90a features (wgmma, TMA), and the GEMM would trap at run time."""


def test_native_module_is_built_for_sm90a():
    import tandem._C as native

    archs = native.cuda_architectures.split(";")
    assert "90a" in archs, f"tandem._C was built for CUDA architectures {archs}, not sm_90a"
