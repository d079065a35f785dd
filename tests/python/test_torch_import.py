"""`import optex` never needs PyTorch; `optex.torch` says clearly when it is missing.

These run without torch installed (CI): the subprocesses hide torch with
sys.modules['torch'] = None, which makes `import torch` fail as if it were not
installed.
"""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)


def test_import_optex_works_without_torch() -> None:
    done = run_python(
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "import optex\n"
        "opt = optex.OptEx(np.ones(3), parallelism=2)\n"
        "opt.ask()\n"
        "opt.tell(np.zeros((2, 3)), np.zeros(2))\n"
        "print('ok', opt.iteration)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "1"]


def test_optex_torch_without_torch_raises_a_clear_import_error() -> None:
    done = run_python(
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import optex\n"
        "for attempt in ('import', 'attribute'):\n"
        "    try:\n"
        "        if attempt == 'import':\n"
        "            import optex.torch\n"
        "        else:\n"
        "            optex.torch\n"
        "    except ImportError as error:\n"
        "        print(attempt, '|', error)\n"
        "    else:\n"
        "        print(attempt, '| no error')\n"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line, attempt in zip(lines, ("import", "attribute")):
        assert line.startswith(attempt + " |")
        assert "optex.torch needs PyTorch" in line
        assert "pip install torch" in line


def test_import_optex_does_not_import_torch() -> None:
    done = run_python("import sys, optex\nprint('torch' in sys.modules)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_unknown_attributes_still_raise_attribute_error() -> None:
    done = run_python(
        "import optex\n"
        "print(hasattr(optex, 'no_such_thing'))\n"
        "try:\n"
        "    optex.no_such_thing\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "module 'optex' has no attribute 'no_such_thing'"]
