"""Early stopping (largetrain_core.training.early_stopping) against Hugging Face's EarlyStoppingCallback
rule, and its state carried through a checkpoint's client state."""

from largetrain_core.training.early_stopping import EarlyStopping


def test_stops_after_patience_evaluations_without_an_improvement_above_the_threshold():
    e = EarlyStopping(patience=2, threshold=0.1)
    for step, loss in [(10, 3.0), (20, 2.5), (30, 2.45), (40, 2.7)]:
        assert not e.stopped
        e.update(loss, step)
    # 2.45 is the best, but not better than 2.5 by more than 0.1: it counts against patience, as 2.7 does
    assert e.stopped and (e.best_eval_loss, e.best_eval_step, e.bad_evals) == (2.45, 30, 2)
    assert e.reason(40) == (
        "early stopping at step 40: no validation loss below 2.4500 (step 30) by more than 0.1 nats in 2 evaluations"
    )


def test_an_improvement_resets_the_count_and_no_patience_never_stops():
    e = EarlyStopping(patience=2, threshold=0.0)
    for step, loss in enumerate([3.0, 3.1, 2.9, 3.0]):
        e.update(loss, step)
    assert not e.stopped and e.bad_evals == 1
    never = EarlyStopping(patience=None, threshold=0.0)
    for step in range(20):
        never.update(5.0, step)
    assert not never.stopped and never.bad_evals == 19


def test_state_resumes_the_count():
    e = EarlyStopping(patience=3, threshold=0.0)
    e.update(2.0, 1)
    e.update(2.5, 2)
    state = e.state()
    assert state == {"best_eval_loss": 2.0, "best_eval_step": 1, "bad_evals": 1, "stopped": False}
    resumed = EarlyStopping(patience=3, threshold=0.0)
    resumed.load(state)
    resumed.update(2.2, 3)
    resumed.update(2.1, 4)
    assert resumed.stopped and resumed.bad_evals == 3
