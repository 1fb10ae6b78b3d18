"""Simulator processes: exact parity with the in-process env, fault recovery, clean shutdown.

Every test here starts real spawned simulator processes (each takes seconds to start: the
child imports torch through ``embodied_rl``), so they use few processes and short runs.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from embodied_rl.registry import SIMULATORS, UnknownNameError
from simulators.checker import check_vector_env
from simulators.reach import ReachVectorEnv, build_reach, expert_actions
from simulators.registry import Simulator
from simulators.workers import SHM_PREFIX, ProcessVectorEnv, SimulatorWorkerError

TASKS, INITS = [0, 1, 2, 3], [4, 9, 16, 25]


def _our_shm_blocks() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}_{os.getpid()}_*"))


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _episode(env, steps: int, kill_at: int | None = None, tasks=TASKS, inits=INITS) -> list:
    """Roll out a noisy expert; optionally SIGKILL the last child before step ``kill_at``.

    Returns:
        One tuple per step (after the reset): state, image, reward, done, success.
    """
    rng = np.random.default_rng(0)  # the same noise on every call: comparable episodes
    obs = env.reset(tasks[: env.num_envs], inits[: env.num_envs])
    records = [(obs.state, obs.image, None, None, None, env.privileged_progress())]
    for t in range(steps):
        if t == kill_at:
            os.kill(env.child_pids()[-1], signal.SIGKILL)
        noise = rng.uniform(-1, 1, (env.num_envs, 2)).astype(np.float32)
        result = env.step(np.clip(0.4 * expert_actions(obs.state) + 0.6 * noise, -1, 1))
        obs = result.obs
        records.append((*_step_record(result), env.privileged_progress()))
    return records


def _chunked_episode(env, chunks: int, size: int, kill_at: int | None = None) -> list:
    """Like :func:`_episode` with ``size`` actions per ``step_chunk`` (the same noise)."""
    rng = np.random.default_rng(1)
    obs = env.reset(TASKS[: env.num_envs], INITS[: env.num_envs])
    records = [(obs.state, obs.image, None, None, None, env.privileged_progress())]
    for t in range(chunks):
        if t == kill_at:
            os.kill(env.child_pids()[-1], signal.SIGKILL)
        chunk = rng.uniform(-1, 1, (env.num_envs, size, 2)).astype(np.float32)
        result = env.step_chunk(chunk)
        obs = result.obs
        records.append((*_step_record(result), env.privileged_progress()))
    return records


def _step_record(result) -> tuple:
    return result.obs.state, result.obs.image, result.reward, result.done, result.success


def _assert_same(records, expected) -> None:
    """Records: state, image, reward, done, success and privileged progress per step."""
    assert len(records) == len(expected)
    names = ("state", "image", "reward", "done", "success", "privileged progress")
    for t, (got, want) in enumerate(zip(records, expected)):
        for name, a, b in zip(names, got, want):
            if b is None:
                assert a is None, (t, name)
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"step {t}: {name}")


def test_processes_is_an_option_of_a_simulator_checked_before_spawning():
    # The pool is not a simulator: no registered name, and a lookup lists the real ones.
    assert "processes" not in SIMULATORS
    with pytest.raises(UnknownNameError, match="Known: .*reach"):
        SIMULATORS.get("processes")
    with pytest.raises(UnknownNameError, match="Did you mean 'reach'"):
        SIMULATORS.get("reachh")
    reach = SIMULATORS.get("reach")
    assert isinstance(reach, Simulator) and reach.build is build_reach
    for processes in (0, None):
        env = reach({}, 3, processes=processes)
        assert isinstance(env, ReachVectorEnv) and env.num_envs == 3
        env.close()
    with pytest.raises(ValueError, match="step_timeout_s"):
        reach({}, 3, processes=0, step_timeout_s=1.0)
    with pytest.raises(ValueError, match="num_processes"):
        reach({}, 2, processes=3)
    assert _our_shm_blocks() == []


def test_process_env_matches_in_process_and_reruns_a_killed_child(caplog):
    options = {"image_size": 32, "render_size": 24}
    reference = SIMULATORS.get("reach")(options, 4)
    env = SIMULATORS.get("reach")(options, 4, processes=2)
    pids, new_pids = env.child_pids(), []
    try:
        assert isinstance(env, ProcessVectorEnv) and env.spec == reference.spec
        # Spawned, not forked: a spawned child runs multiprocessing's spawn_main.
        for pid in pids:
            assert b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert len(_our_shm_blocks()) == 2  # one block per process
        check_vector_env(env, num_steps=3)

        expected = _episode(reference, steps=30)
        assert any(rec[3].any() for rec in expected[1:])  # some episodes end in the window
        for _, _, _, _, success, progress in expected[1:]:  # compared below: not trivial
            assert np.all(progress[success] == 1.0) and np.all(progress[~success] < 1.0)
        assert 0.3 < max(rec[5].max() for rec in expected[1:] if not rec[4].all())
        _assert_same(_episode(env, steps=30), expected)
        assert env.task_descriptions == reference.task_descriptions
        np.testing.assert_array_equal(env.render(), reference.render())
        video = env.render(40)  # another size than render_shape: over the pipes
        assert video.shape == (4, 40, 40, 3)
        np.testing.assert_array_equal(video, reference.render(40))
        assert env.fault_counts()["restarts"] == 0

        with caplog.at_level(logging.WARNING, logger="simulators.workers"):
            disturbed = _episode(env, steps=30, kill_at=12)
        _assert_same(disturbed, expected)
        counts = env.fault_counts()
        assert counts == {"restarts": 1, "crashes": 1, "timeouts": 0, "errors": 0}, counts
        new_pids = env.child_pids()
        assert new_pids[0] == pids[0] and new_pids[1] != pids[1]
        assert "crash during 'step_chunk'" in caplog.text
        assert "re-running its 12 steps" in caplog.text
        np.testing.assert_array_equal(env.render(), reference.render())

        # Chunks: one message per process; after a kill, the steps of the chunks received
        # since the reset are replayed as one chunk (4 chunks x 3 = 12 steps).
        expected = _chunked_episode(reference, chunks=8, size=3)
        with caplog.at_level(logging.WARNING, logger="simulators.workers"):
            _assert_same(_chunked_episode(env, chunks=8, size=3, kill_at=4), expected)
        assert env.fault_counts()["restarts"] == 2
        assert caplog.text.count("re-running its 12 steps") == 2
        new_pids += env.child_pids()
    finally:
        env.close()
        reference.close()
    assert _our_shm_blocks() == []
    assert not any(_alive(pid) for pid in pids + new_pids)


def test_envs_left_out_stay_out_in_the_processes_and_after_a_restart(caplog):
    """``active`` reaches each process: one with its second env left out, one with both
    (it steps nothing). Killing the first mid-episode re-runs it with the same envs left
    out, and every step equals the in-process env's with the same mask."""
    active = np.array([True, False, False, False])

    def episode(env, kill_at=None):
        rng = np.random.default_rng(2)
        obs = env.reset(TASKS, INITS, active)
        records = [(obs.state, obs.image, None, None, None, env.privileged_progress())]
        for t in range(20):
            if t == kill_at:
                os.kill(env.child_pids()[0], signal.SIGKILL)
            noise = rng.uniform(-1, 1, (4, 2)).astype(np.float32)
            result = env.step(np.clip(0.4 * expert_actions(obs.state) + 0.6 * noise, -1, 1))
            obs = result.obs
            records.append((*_step_record(result), env.privileged_progress()))
        return records

    options = {"image_size": 16, "render_size": 16}
    with SIMULATORS.get("reach")(options, 4) as reference:
        expected = episode(reference)
    assert expected[1][3].tolist() == [False, True, True, True]
    env = SIMULATORS.get("reach")(options, 4, processes=2)
    try:
        _assert_same(episode(env), expected)
        assert env.task_descriptions == ["reach the red target", "", "", ""]
        with caplog.at_level(logging.WARNING, logger="simulators.workers"):
            _assert_same(episode(env, kill_at=8), expected)
        assert env.fault_counts()["restarts"] == 1 and "re-running its 8 steps" in caplog.text
        assert env.render(envs=[0]).shape == (1, 16, 16, 3)
        with pytest.raises(ValueError, match=r"envs \[3\] were left out"):
            env.render(envs=[3])
    finally:
        env.close()


def _fault_env(tmp_path, fault: str, once: bool, **worker_options) -> ProcessVectorEnv:
    options = {fault: 3}
    if once:
        options["debug_fault_once_path"] = str(tmp_path / "fault-fired")
    return SIMULATORS.get("reach")(options, 2, processes=1, **worker_options)


def test_hung_child_times_out_and_its_episode_is_rerun(tmp_path):
    with SIMULATORS.get("reach")({}, 2) as reference:
        expected = _episode(reference, steps=6)
    env = _fault_env(tmp_path, "debug_hang_at_step", once=True, step_timeout_s=1.0)
    try:
        start = time.monotonic()
        records = _episode(env, steps=6)
        elapsed = time.monotonic() - start
        _assert_same(records, expected)
        assert env.fault_counts() == {"restarts": 1, "crashes": 0, "timeouts": 1, "errors": 0}
        assert elapsed >= 1.0  # it waited for the timeout, not for the 3600 s hang
        assert (tmp_path / "fault-fired").exists()
    finally:
        env.close()
    assert _our_shm_blocks() == []


def test_exception_in_step_restarts_the_child(tmp_path, caplog):
    with SIMULATORS.get("reach")({}, 2) as reference:
        expected = _episode(reference, steps=6)
    env = _fault_env(tmp_path, "debug_raise_at_step", once=True)
    try:
        with caplog.at_level(logging.WARNING, logger="simulators.workers"):
            records = _episode(env, steps=6)
        _assert_same(records, expected)
        assert env.fault_counts() == {"restarts": 1, "crashes": 0, "timeouts": 0, "errors": 1}
        assert "InjectedSimulatorFault" in caplog.text
    finally:
        env.close()
    assert _our_shm_blocks() == []


def test_gives_up_after_max_restarts_naming_the_envs(tmp_path):
    env = _fault_env(tmp_path, "debug_raise_at_step", once=False, max_restarts=1)
    pid = env.child_pids()[0]
    env.reset([0, 1], [0, 0])
    env.step(np.zeros((2, 2), np.float32))
    env.step(np.zeros((2, 2), np.float32))
    with pytest.raises(SimulatorWorkerError, match=r"envs 0\.\.1.*max_restarts=1"):
        env.step(np.zeros((2, 2), np.float32))  # fails, restarts, re-runs, fails again
    assert env.fault_counts() == {"restarts": 1, "crashes": 0, "timeouts": 0, "errors": 2}
    with pytest.raises(RuntimeError, match="closed"):  # giving up closed everything
        env.step(np.zeros((2, 2), np.float32))
    assert _our_shm_blocks() == [] and not _alive(pid)


def test_child_that_cannot_build_its_env_fails_clearly_and_leaks_nothing():
    with pytest.raises(SimulatorWorkerError, match=r"(?s)failed to start.*num_tasks must be in"):
        SIMULATORS.get("reach")({"num_tasks": 99}, 2, processes=1)
    assert _our_shm_blocks() == []
