"""Choosing one ``checkpoint-N/`` of a Trainer output directory (``ckptgate.inspect.runs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptgate.errors import ExitCode, UsageError
from ckptgate.inspect.runs import list_checkpoints, select_checkpoint


def _run_dir(root: Path, *steps: int) -> Path:
    root.mkdir()
    for n in steps:
        (root / f"checkpoint-{n}").mkdir()
        (root / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    return root


def test_several_checkpoints_and_no_choice_is_a_typed_error_listing_them(tmp_path):
    root = _run_dir(tmp_path / "run", 10, 2, 100)
    with pytest.raises(UsageError) as e:
        select_checkpoint(root, None)
    assert e.value.code == "usage.checkpoint.ambiguous" and e.value.exit_code == ExitCode.USAGE
    assert e.value.evidence["checkpoints"] == ["checkpoint-2", "checkpoint-10", "checkpoint-100"]


def test_latest_is_the_highest_step_by_number_not_by_name(tmp_path):
    root = _run_dir(tmp_path / "run", 10, 2, 9)
    assert select_checkpoint(root, "latest") == root / "checkpoint-10"
    assert select_checkpoint(root, "2") == root / "checkpoint-2"


def test_an_unknown_step_or_a_bad_choice_is_a_typed_error(tmp_path):
    root = _run_dir(tmp_path / "run", 1, 2)
    for choice in ("3", "last", "-1"):
        with pytest.raises(UsageError) as e:
            select_checkpoint(root, choice)
        assert e.value.code == "usage.checkpoint.not_found"
        assert e.value.evidence["checkpoints"] == ["checkpoint-1", "checkpoint-2"]


def test_a_plain_checkpoint_directory_is_itself_and_refuses_the_option(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"x")
    assert select_checkpoint(root, None) == root
    with pytest.raises(UsageError) as e:
        select_checkpoint(root, "latest")
    assert e.value.code == "usage.checkpoint.not_a_run"


def test_one_checkpoint_alone_is_taken_but_not_beside_other_files(tmp_path):
    root = _run_dir(tmp_path / "run", 5)
    assert select_checkpoint(root, None) == root / "checkpoint-5"
    (root / "model.safetensors").write_bytes(b"x")  # Trainer.save_model() at the end writes here
    with pytest.raises(UsageError) as e:
        select_checkpoint(root, None)
    assert e.value.code == "usage.checkpoint.ambiguous"
    assert select_checkpoint(root, "5") == root / "checkpoint-5"


def test_a_symlinked_checkpoint_is_not_a_candidate(tmp_path):
    root = _run_dir(tmp_path / "run", 1)
    elsewhere = _run_dir(tmp_path / "elsewhere", 7)
    (root / "checkpoint-9").symlink_to(elsewhere / "checkpoint-7")
    assert list_checkpoints(root) == [(1, "checkpoint-1")]
    assert select_checkpoint(root, "latest") == root / "checkpoint-1"


@pytest.mark.parametrize("choice", ["5", "05", "005", "latest"])
def test_folders_with_equal_step_numbers_are_ambiguous_for_every_choice(tmp_path, choice):
    root = _run_dir(tmp_path / "run", 1)
    for name in ("checkpoint-5", "checkpoint-05"):
        (root / name).mkdir()
    with pytest.raises(UsageError) as e:
        select_checkpoint(root, choice)
    assert e.value.code == "usage.checkpoint.ambiguous" and e.value.exit_code == ExitCode.USAGE
    assert sorted(e.value.evidence["checkpoints"]) == ["checkpoint-05", "checkpoint-5"]
    assert "(checkpoint-05, checkpoint-5)" in e.value.message
    # a step that is not duplicated is still chosen by number, whatever its spelling
    assert select_checkpoint(root, "01") == root / "checkpoint-1"


def test_latest_is_unambiguous_when_only_a_lower_step_is_duplicated(tmp_path):
    root = _run_dir(tmp_path / "run", 5, 7)
    (root / "checkpoint-05").mkdir()
    assert select_checkpoint(root, "latest") == root / "checkpoint-7"


def test_only_ascii_digits_make_a_step_number(tmp_path):
    root = _run_dir(tmp_path / "run", 5)
    (root / "checkpoint-\u0665").mkdir()  # ARABIC-INDIC DIGIT FIVE: int() reads it as 5
    assert list_checkpoints(root) == [(5, "checkpoint-5")]
    # int() reads ARABIC-INDIC and FULLWIDTH DIGIT FIVE as 5, and raises on SUPERSCRIPT TWO
    for choice in ("\u0665", "\u00b2", "\uff15"):
        with pytest.raises(UsageError) as e:
            select_checkpoint(root, choice)
        assert e.value.code == "usage.checkpoint.not_found"


def test_a_checkpoint_folder_beside_its_own_attestation_is_still_the_one_checkpoint(tmp_path: Path) -> None:
    from ckptgate.inspect.runs import select_checkpoint

    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3.intoto.dsse.json").write_text("{}")
    assert select_checkpoint(tmp_path, None) == tmp_path / "checkpoint-3"
    (tmp_path / "checkpoint-2.intoto.dsse.json").write_text("{}")  # another checkpoint's envelope is another entry
    with pytest.raises(UsageError):
        select_checkpoint(tmp_path, None)


def _megatron_run(root: Path, iterations: list[int], tracker: str | None) -> Path:
    for i in iterations:
        (root / f"iter_{i:07d}").mkdir(parents=True)
        (root / f"iter_{i:07d}" / "metadata.json").write_text("{}")
    if tracker is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(tracker)
    return root


def test_a_megatron_lm_run_is_taken_one_iteration_at_a_time(tmp_path: Path) -> None:
    """Megatron-LM's iter_NNNNNNN/ folders are a run like Trainer's checkpoint-N/ (issue #39): one is
    chosen, and latest is the iteration the tracker names (the last completed save), not the highest."""
    run = _megatron_run(tmp_path / "run", [100, 200, 300], "200\n")
    with pytest.raises(UsageError) as e:
        select_checkpoint(run, None)
    assert e.value.code == "usage.checkpoint.ambiguous" and "iter_0000300" in e.value.message
    assert select_checkpoint(run, "100") == run / "iter_0000100"
    assert select_checkpoint(run, "latest") == run / "iter_0000200"  # 300 is not a completed save
    one = _megatron_run(tmp_path / "one", [5], "5")
    assert select_checkpoint(one, None) == one / "iter_0000005"  # the tracker beside it is no other entry


@pytest.mark.parametrize("tracker", ["400", "release", "", "2" * 70])
def test_a_tracker_that_names_no_iteration_here_is_refused_for_latest(tmp_path: Path, tracker: str) -> None:
    run = _megatron_run(tmp_path / "run", [100, 200], tracker)
    with pytest.raises(UsageError) as e:
        select_checkpoint(run, "latest")
    assert e.value.code == "usage.checkpoint.tracker" and "iter_0000100" in e.value.message
    assert select_checkpoint(run, "200") == run / "iter_0000200"


def test_equal_iterations_in_both_spellings_are_ambiguous(tmp_path: Path) -> None:
    run = _megatron_run(tmp_path / "run", [7], None)
    (run / "checkpoint-7").mkdir()
    with pytest.raises(UsageError) as e:
        select_checkpoint(run, "7")
    assert e.value.code == "usage.checkpoint.ambiguous"


@pytest.mark.parametrize("tracker", ["missing", "dangling_link", "link_to_a_file"])
def test_latest_in_a_megatron_run_needs_the_tracker_itself(tmp_path: Path, tracker: str) -> None:
    """Without the tracker the last completed save is unknown: the highest iter_ folder may be a save
    still being written, so latest is refused, never the highest; a linked tracker is not Megatron's."""
    run = _megatron_run(tmp_path / "run", [100, 200], None)
    if tracker == "dangling_link":
        (run / "latest_checkpointed_iteration.txt").symlink_to(tmp_path / "gone")
    elif tracker == "link_to_a_file":
        (tmp_path / "elsewhere.txt").write_text("100")
        (run / "latest_checkpointed_iteration.txt").symlink_to(tmp_path / "elsewhere.txt")
    with pytest.raises(UsageError) as e:
        select_checkpoint(run, "latest")
    assert e.value.code == "usage.checkpoint.tracker" and "iter_0000200" in e.value.message
    assert select_checkpoint(run, "200") == run / "iter_0000200"  # a named iteration needs no tracker


def test_the_only_iteration_is_taken_alone_only_when_the_tracker_names_it(tmp_path: Path) -> None:
    """A tracker beside one iter_ folder that names another iteration (its folder gone) says that folder
    is not a completed save: it is refused, not taken because it is alone."""
    run = _megatron_run(tmp_path / "run", [300], "200")
    with pytest.raises(UsageError) as e:
        select_checkpoint(run, None)
    assert e.value.code == "usage.checkpoint.tracker" and "iteration 200" in e.value.message
    assert select_checkpoint(run, "300") == run / "iter_0000300"  # named explicitly, it is the user's choice
