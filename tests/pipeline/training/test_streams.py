import torch

from pipeline.training.streams import BatchStream


def _stream(toy, seed=5):
    ds = toy.Dataset(30, seed=seed)
    return BatchStream(ds, toy.Sampler(ds.lengths, max_tokens=40, seed=seed), toy.collate, seed=seed, name="t")


def test_resume_reproduces_the_batches_across_epoch_boundaries(toy):
    full = _stream(toy)
    reference = [full.next_batch() for _ in range(25)]  # 30 examples in ~5-8 batches: several epochs
    assert full.epoch >= 2
    for cut in (0, 3, 7, 13):
        s = _stream(toy)
        for _ in range(cut):
            s.next_batch()
        resumed = _stream(toy)
        resumed.load_state_dict(s.state_dict())
        for want in reference[cut:]:
            got = resumed.next_batch()
            assert all(torch.equal(got[k], want[k]) for k in want)


def test_epochs_reshuffle_and_remask(toy):
    s = _stream(toy)
    first = s.next_batch()
    while s.epoch == 0:
        s.next_batch()
    second = s.next_batch()
    assert not torch.equal(first["input_ids"], second["input_ids"]) or first["input_ids"].shape != second["input_ids"].shape


def test_streams_do_not_touch_the_global_rng(toy):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    s = _stream(toy)
    for _ in range(12):
        s.next_batch()
    assert torch.equal(torch.get_rng_state(), before)


def test_worker_processes_give_the_same_batches_and_positions(toy):
    ds = toy.Dataset(30, seed=5)
    inline = _stream(toy)
    workers = BatchStream(ds, toy.Sampler(ds.lengths, max_tokens=40, seed=5), toy.collate, seed=5, num_workers=1)
    for _ in range(9):  # past the first epoch boundary
        a, b = inline.next_batch(), workers.next_batch()
        assert all(torch.equal(a[k], b[k]) for k in a)
    # prefetching ran ahead, the saved position did not
    assert workers.state_dict() == inline.state_dict()
