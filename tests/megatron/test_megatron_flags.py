"""Every data-related flag of Megatron-LM is listed (zephon_megatron.flags and the adapter's
README): read with Megatron's meaning, kept to Megatron, or refused by name."""

from __future__ import annotations

import argparse
import importlib.util

import pytest
from megatron_helpers import PACKED, REPO, megatron_argv, parse

from zephon_megatron.arguments import ZephonArgumentError, settings_from_args
from zephon_megatron.flags import (
    ALSO_READ,
    MEGATRON_GROUPS,
    REFUSALS,
    REFUSED,
    TABLE,
    markdown_table,
)

README = REPO / "integrations" / "megatron" / "README.md"


def megatron_data_flags() -> dict[str, list[str]]:
    """{group title: the first option string of every flag} of Megatron-LM's parser."""
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return {group.title: [action.option_strings[0] for action in group._group_actions]
            for group in parser._action_groups if group.title in MEGATRON_GROUPS}


@pytest.mark.skipif(importlib.util.find_spec("megatron.training") is None,
                    reason="Megatron-LM (megatron.training) is not importable: megatron-core "
                    "0.19+ ships it; for 0.16 put a core_v0.16.1 checkout on PYTHONPATH")
def test_every_data_flag_of_the_installed_megatron_is_in_the_table() -> None:
    groups = megatron_data_flags()
    assert set(groups) == set(MEGATRON_GROUPS), "Megatron-LM renamed an argument group"
    unlisted = sorted(flag for flags in groups.values() for flag in flags
                      if flag not in TABLE)
    assert not unlisted, (f"Megatron-LM has data flags zephon_megatron.flags.TABLE does not "
                          f"list (read, keep to Megatron, or refuse each): {unlisted}")


def test_the_readme_carries_the_table() -> None:
    readme = README.read_text()
    assert markdown_table() in readme, ("integrations/megatron/README.md's flag table is not "
                                        "zephon_megatron.flags.markdown_table()")
    assert all(f"`{flag}`" in readme for flag in [*TABLE, *ALSO_READ])


def given(flag: str) -> list[str]:
    refusal = REFUSALS[flag]
    if refusal.kind != "value":
        return [flag]
    return [flag, {int: "4", float: "0.5"}.get(refusal.type, "/no/such/file.json")]


@pytest.mark.parametrize("flag", sorted(REFUSALS))
def test_a_refused_flag_is_refused_by_name_with_what_to_do(flag: str) -> None:
    assert TABLE[flag][0] == REFUSED
    with pytest.raises(ZephonArgumentError) as refused:
        settings_from_args(parse(megatron_argv(PACKED, *given(flag))))
    message = str(refused.value)
    assert f"{flag}" in message and "has no effect with --dataloader zephon" in message
    assert TABLE[flag][1] in message


def test_sft_names_the_chat_recipe_and_a_missing_sequences_file_is_refused_too() -> None:
    with pytest.raises(ZephonArgumentError, match='kind = "chat"'):
        settings_from_args(parse(megatron_argv(PACKED, "--sft")))
    with pytest.raises(ZephonArgumentError, match="--per-dataset-sequences-path /no/such"):
        settings_from_args(parse(megatron_argv(PACKED, "--per-dataset-sequences-path",
                                               "/no/such")))


def test_megatrons_defaults_given_explicitly_are_not_refused() -> None:
    settings_from_args(parse(megatron_argv(PACKED, "--num-dataset-builder-threads", "1",
                                           "--mid-level-dataset-surplus", "0.005")))
