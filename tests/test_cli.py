from conftest import run_cli


def test_bench_sweeps_threads_and_recommends(small_dataset):
    r = run_cli("fastload", "bench", str(small_dataset), "--batch-size", "16", "--threads", "1", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["threads", "samples/s", "MB/s"]
    assert [line.split()[0] for line in lines[1:3]] == ["1", "2"]
    assert lines[-1].startswith("recommended: num_threads=")


def test_bench_on_a_missing_dataset(tmp_path):
    r = run_cli("fastload", "bench", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "no such dataset directory" in r.stderr


def test_python_dash_m_fastload_info():
    r = run_cli("fastload", "info")
    assert r.returncode == 0
    for key in ("platform:", "cpus:", "native extension:", "cuda:", "torch", "recommended: num_threads="):
        assert key in r.stdout


def test_preprocessing_and_verify_start_without_torch():
    import subprocess
    import sys

    code = ("import sys, fastload, fastload.preprocess, fastload.cli, fastload.format._verify; "
            "fastload.write_arrays; fastload.Field; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_public_name_resolves():
    import fastload

    for name in fastload.__all__:
        assert getattr(fastload, name) is not None
