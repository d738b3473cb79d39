import torch

from p2prl.rl.cpu import THREADS_ENV, default_threads, torch_threads


def test_default_threads_env(monkeypatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert default_threads() == 1
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    for bad in ("0", "-2", "many", ""):
        monkeypatch.setenv(THREADS_ENV, bad)
        assert default_threads() == 1


def test_torch_threads_sets_and_restores(monkeypatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    with torch_threads(2) as n:
        assert n == 2 and torch.get_num_threads() == 2
        with torch_threads(0) as m:
            assert m == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    try:
        with torch_threads(2):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.get_num_threads() == before
