"""The README's test command refuses a bad setting in one line before it sets anything up."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("workers", ["abc", "", "-1", "2.5"])
def test_a_worker_count_that_is_not_a_whole_number_is_refused_in_one_line(workers):
    env = {**os.environ, "KERNELAB_TEST_WORKERS": workers}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"scripts/test.sh: KERNELAB_TEST_WORKERS must be a whole number of pytest workers (0: one process), "
        f"not '{workers}'"]
    assert done.stdout == ""
