"""The stateful machine over the reference model alone (docs/design.md#one-table-read-by-everything): invariants after every step."""

from hypothesis import settings

from atmostonce.testing.stateful import make_machine

ModelMachine = make_machine(None)
ModelMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestModelMachine = ModelMachine.TestCase
