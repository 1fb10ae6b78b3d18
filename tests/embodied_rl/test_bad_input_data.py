"""Bad prompt files never end in a traceback: property-based tests of the prompt loader.

Hypothesis generates prompt files with broken, empty and overlong rows. The loader must
refuse the file with a ``ValueError`` naming the file and the first bad line, or drop the
rows and count them per reason, as ``embodied_rl.data.dataloader`` documents.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from embodied_rl import keys as K
from embodied_rl.data.batch import strings
from embodied_rl.data.dataloader import ShardedPromptLoader
from tests.embodied_rl.bad_input_common import FAST, SCALARS

LINES = st.one_of(
    st.builds(
        lambda p, a: json.dumps({"prompt": p, "answer": a}),
        st.text(" ab\t", max_size=12),
        st.text("0123", max_size=2),
    ),
    st.builds(lambda p: json.dumps({"prompt": p}), st.text("ab ", max_size=6)),
    st.builds(lambda v: json.dumps({"prompt": v, "answer": "1"}), SCALARS),
    st.builds(json.dumps, SCALARS | st.lists(st.integers(), max_size=2)),
    st.sampled_from(['{"prompt": "x"', "{", '{"prompt": "a b", "answer": 1}', "", "  "]),
)
MAX_WORDS = 3


def expected_reason(line: str) -> str | None:
    """Why the loader must not use this row (the documented rules, restated)."""
    try:
        record = json.loads(line)
    except ValueError:
        return "malformed"
    if not isinstance(record, dict):
        return "malformed"
    if record.get("prompt") is None or record.get("answer") is None:
        return "missing_field"
    if not isinstance(record["prompt"], str):
        return "malformed"
    if not record["prompt"].strip():
        return "empty"
    return "too_long" if len(record["prompt"].split()) > MAX_WORDS else None


@FAST
@given(lines=st.lists(LINES, max_size=12), on_bad_row=st.sampled_from(["error", "drop"]))
def test_prompt_files_are_refused_at_the_first_bad_line_or_dropped_with_counts(lines, on_bad_row):
    rows = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    reasons = {number: expected_reason(line) for number, line in rows}
    usable = [json.loads(line)["prompt"] for number, line in rows if reasons[number] is None]
    refused = [n for n, r in reasons.items() if r in ("malformed", "missing_field")]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompts.jsonl"
        path.write_text("\n".join(lines))
        try:
            loader = ShardedPromptLoader(
                path,
                global_batch_size=1,
                dp_rank=0,
                dp_size=1,
                seed=0,
                shuffle=False,
                required_fields=("prompt", "answer"),
                on_bad_row=on_bad_row,
                max_prompt_tokens=MAX_WORDS,
                count_tokens=lambda prompts: [len(p.split()) for p in prompts],
            )
        except ValueError as err:
            if refused and on_bad_row == "error":
                assert str(err).startswith(f"{path}: line {min(refused)} "), str(err)
                assert "Fix or remove those rows" in str(err)
            else:
                assert not usable and "has no usable rows" in str(err), str(err)
            return
        assert not (refused and on_bad_row == "error") and usable
        assert loader.dropped == dict(Counter(r for r in reasons.values() if r is not None))
        epoch = [strings(loader.next_batch(), K.PROMPT_TEXT)[0] for _ in usable]
        assert epoch == usable
