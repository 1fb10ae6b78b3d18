"""Echo: the smallest multi-turn text environment whose every turn needs the environment.

Each turn the environment names a number and the model must say it back::

    user:      say 4
    assistant: 4
    user:      correct. say 19
    assistant: 18
    user:      no, 19. say 7

The number to say exists only in the environment's latest message, so a policy that ignores
the environment turns scores about 1/11 per one-digit turn, while one that reads them can
score 1. With the conversation as plain text (``conversation_format: plain``) a tiny
random-init model learns it by RL in minutes on a CPU (all three turns right in 0.99 of the
conversations after 60 steps, ``configs/grpo_multiturn_llm.yaml``), which makes it the check
that multi-turn training works end to end (environment turns appended, masked out of the
loss, attended to). Through a chat template the digit sits several template tokens back and
the same model stays near chance; ``running_sum`` is the harder task.

Data rows: ``prompt`` is ``"say <first number>"`` and ``answer`` the numbers of every turn,
space-separated (``"4 19 7"``). Each turn's reward is 1 for the exact number, else 0; the
final reward is 1 when every turn was exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from embodied_rl.interfaces import TurnResult
from embodied_rl.registry import TEXT_ENVS
from embodied_rl.tasks.arithmetic import parse_integer


def parse_numbers(answer: str) -> list[int]:
    """``"4 19 7"`` -> [4, 19, 7]."""
    numbers = [parse_integer(part) for part in answer.split()]
    if not numbers or any(n is None for n in numbers):
        raise ValueError(
            f"echo answer {answer!r} must be the numbers of every turn, space-separated "
            "integers (e.g. '4 19 7'); fix the data file"
        )
    return numbers


@dataclass
class EchoEpisode:
    numbers: list[int]
    turn: int = 0
    exact_turns: int = 0

    def step(self, response: str) -> TurnResult:
        if self.turn >= len(self.numbers):
            raise RuntimeError("echo episode stepped after it ended")
        target = self.numbers[self.turn]
        reward = float(parse_integer(response) == target)
        self.exact_turns += int(reward)
        self.turn += 1
        if self.turn == len(self.numbers):
            return TurnResult(observation=None, reward=reward, done=True)
        verdict = "correct." if reward else f"no, {target}."
        return TurnResult(f"{verdict} say {self.numbers[self.turn]}", reward, done=False)

    def final_reward(self) -> float:
        return float(self.exact_turns == len(self.numbers))


@TEXT_ENVS.register("echo")
class Echo:
    """The echo environment (module doc); it takes no options."""

    def start(self, prompt: str, answer: str) -> EchoEpisode:
        numbers = parse_numbers(answer)
        if prompt.strip() != f"say {numbers[0]}":
            raise ValueError(
                f"echo prompt {prompt!r} must be 'say {numbers[0]}' (the answer's first "
                "number); fix the data file"
            )
        return EchoEpisode(numbers)


def generate_echo_episodes(
    n: int, seed: int, *, turns: int = 3, max_number: int = 9
) -> list[dict[str, str]]:
    """``n`` episodes of ``turns`` numbers in ``0..max_number``, deterministic in ``seed``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        numbers = [rng.randint(0, max_number) for _ in range(turns)]
        rows.append({"prompt": f"say {numbers[0]}", "answer": " ".join(map(str, numbers))})
    return rows
