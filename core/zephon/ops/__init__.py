"""Pipeline operators: one module per transformation (see :mod:`zephon.ops.base`).

Each module holds the operator's frozen spec (its documented options, from which the recipe
schema is derived), the operator built from it and, for row operators, the node a lane runs.
"""

from zephon.ops.base import OperatorSpec
from zephon.ops.batch import BatchSpec
from zephon.ops.filter import FilterSpec
from zephon.ops.map import MapSpec
from zephon.ops.pack import PackFlatSpec, PackSequencesSpec, PackSpec
from zephon.ops.pretokenized import PretokenizedSpec
from zephon.ops.shuffle import ShuffleSpec
from zephon.ops.tokenize import TokenizeSpec
from zephon.ops.tokenize_chat import TokenizeChatSpec

__all__ = ["BatchSpec", "FilterSpec", "MapSpec", "OperatorSpec", "PackFlatSpec",
           "PackSequencesSpec", "PackSpec", "PretokenizedSpec", "ShuffleSpec",
           "TokenizeChatSpec", "TokenizeSpec"]
