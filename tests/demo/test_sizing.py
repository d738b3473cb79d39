"""A demo's version holds the model's step: the toy's for the built-in model, a small one with --model."""

from pathlib import Path

from p2prl.demo.launcher import DemoOptions, sized
from p2prl.demo.sizing import MODEL_STEP, TOY_STEP


def test_unset_fields_come_from_the_models_step_and_set_ones_stay() -> None:
    toy = sized(DemoOptions())
    assert (toy.train_batch_groups, toy.train_epochs, toy.groups_per_batch, toy.batches_per_version) == (
        TOY_STEP.train_batch_groups, TOY_STEP.train_epochs, TOY_STEP.groups_per_batch, TOY_STEP.batches_per_version
    )
    model = sized(DemoOptions(model=Path("m")))
    assert model.train_batch_groups == MODEL_STEP.train_batch_groups and model.train_epochs == 1
    # what two miners announce per version is what one step consumes
    assert 2 * model.groups_per_batch * model.batches_per_version == model.train_batch_groups
    assert sized(DemoOptions(model=Path("m"), train_epochs=2)).train_epochs == 2
    assert sized(model) == model
