"""The README's commands, run as a new user would run them (issue 13).

Every fenced ``bash`` and ``python`` block of README.md (a Python block as one
``python -`` command), and of the docs pages whose commands
continue it (``CONTINUED``: docs/EVALUATION.md runs where a reader follows its
link, after "Use" built the store it evaluates), is split into commands, read
from the pages themselves so they cannot drift, and the commands run in order in
one shell environment: a fresh ``HOME`` (so the README's default data dir), a scratch
working directory, and this test's virtual environment first on ``PATH``, as
``source .venv/bin/activate`` puts it. A command passes when it exits 0 within
its time bound with no Python traceback on stderr; a command that runs until
stopped (``dimple worker``, ``dimple flower``) passes when it is still alive,
and answering, at the end and stops without a traceback.

What the test changes, each rule keyed by the command's text:

- the install is skipped: ``bash ops/install.sh && `` is dropped and
  ``.venv/bin/dimple`` is the ``dimple`` on ``PATH``; ``bash ops/test.sh``
  (this runner) and ``source .venv/bin/activate`` are not run;
- ``redis://127.0.0.1:6379/0`` becomes a redis-server this test starts on a
  free loopback port, and Flower listens on a free port (``DIMPLE_FLOWER_PORT``);
- the placeholder paths ``path/to/scifact`` and ``path/to/locomo10.json`` hold a
  tiny BEIR folder and a tiny LoCoMo-shaped file written by the test.
"""

from __future__ import annotations

import base64
import os
import re
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from ops.stack import Stack, free_port, redis_binary

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Docs pages whose commands continue the README's, each run just before the
# README section named: docs/EVALUATION.md evaluates the store "Use" built and
# must run before "Running on workers" exports a broker URL for every command
# after it. Its section names are its headings, as in README.md.
CONTINUED = {"Running on workers": ["docs/EVALUATION.md"]}
VENV_BIN = Path(sys.executable).parent

# A bound tells a hung command from a slow one; it is not a speed test (speed
# is BENCHMARKS.md's). CI's machine has run 2-3x slower than a quiet one, so
# a bound is about 10x what its command takes on a quiet machine: 0.5-35 s for
# the one-shot commands, which import what they need and load the model. Right
# after a fresh install the first vector search also compiles the descent's
# kernels into numba's on-disk cache (about 7 s).
DEFAULT_BOUND_S = 300.0
# Longer: the demo builds its store (torch and the sentence-transformers model
# embed it), then runs its judged queries many times (18-53 s here).
BOUNDS_S = {
    "dimple demo": 900.0,  # builds the demo store, then 3 modes x the demo query set
    "dimple eval sweep": 900.0,  # 8 configurations x the demo query set
}
SKIP = {
    "bash ops/test.sh": "the test runner itself",
    "source .venv/bin/activate": "the test puts its own venv on PATH",
}
# Commands that fail today because of known bugs: strict, so the test says
# when they are fixed. Keyed by the command's first line.
XFAIL: dict[str, str] = {}
README_BROKER = "redis://127.0.0.1:6379/0"
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Step:
    section: str
    text: str  # as the README has it
    run: str = ""  # as the test runs it
    skip: str = ""
    background: bool = False
    bound: float = DEFAULT_BOUND_S
    outcome: str | None = None  # None: passed; else what went wrong
    seconds: float | None = None
    cpu_seconds: float | None = None  # user + system of the command and what it waited for
    stdout: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return self.text.splitlines()[0]


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """(section heading, body) of every ```bash and ```python block, in order;
    the section is the last ``#`` or ``##`` heading above it (a docs page's
    title is its ``#``). A Python block becomes one command, ``python -`` fed
    the block (``python_command``), run where it stands."""
    out, section, body, lang = [], "", None, ""
    for line in text.splitlines():
        if body is None:
            if line.startswith(("# ", "## ")):
                section = line.split(" ", 1)[1].strip()
            elif line.strip() in ("```bash", "```python"):
                body, lang = [], line.strip()[3:]
        elif line.strip() == "```":
            out.append((section, python_command(body) if lang == "python" else "\n".join(body)))
            body = None
        else:
            body.append(line)
    return out


def python_command(lines: list[str]) -> str:
    """A README Python block as a shell command: ``python -`` reading the
    block; its first code line is in the command's first line (the step's key)."""
    first = next((line for line in lines if line.strip() and not line.startswith("#")), "")
    return "\n".join([f"python - <<'PYTHON'  # {first}", *lines, "PYTHON"])


def split_commands(block: str) -> list[str]:
    """One entry per command: continuation lines joined, a heredoc with its body."""
    lines, out, i = block.splitlines(), [], 0
    while i < len(lines):
        cmd = lines[i]
        i += 1
        if not cmd.strip() or cmd.lstrip().startswith("#"):
            continue
        while cmd.endswith("\\") and i < len(lines):
            cmd += "\n" + lines[i]
            i += 1
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", cmd)
        if heredoc:
            while i < len(lines) and lines[i] != heredoc.group(1):
                cmd += "\n" + lines[i]
                i += 1
            cmd += "\n" + lines[i]
            i += 1
        out.append(cmd)
    return out


def reading_order(readme: str, pages: dict[str, str]) -> list[tuple[str, str]]:
    """The README's blocks with each continued page's blocks inserted before
    the README section ``CONTINUED`` names; ``pages``: path -> text."""
    out, inserted = [], set()
    for section, block in readme_blocks(readme):
        for page in CONTINUED.get(section, []):
            if page not in inserted:
                inserted.add(page)
                out += readme_blocks(pages[page])
        out.append((section, block))
    missing = {p for ps in CONTINUED.values() for p in ps} - inserted
    assert not missing, f"README.md has no bash block under the section that {sorted(missing)} continue"
    return out


def plan(blocks: list[tuple[str, str]]) -> list[Step]:
    steps = []
    for section, block in blocks:
        for cmd in split_commands(block):
            step = Step(section, cmd)
            run = re.sub(r"^bash ops/install\.sh && ", "", cmd).replace(".venv/bin/dimple", "dimple")
            step.run = run
            step.skip = next((why for prefix, why in SKIP.items() if cmd.startswith(prefix)), "")
            step.background = bool(re.match(r"(\w+=\S+ )*dimple (worker|flower)\b", run))
            step.bound = next((s for prefix, s in BOUNDS_S.items() if run.startswith(prefix)), DEFAULT_BOUND_S)
            steps.append(step)
    return steps


STEPS = plan(reading_order(README.read_text(encoding="utf-8"),
                           {page: (ROOT / page).read_text(encoding="utf-8")
                            for pages in CONTINUED.values() for page in pages}))


def _tiny_datasets(work: Path) -> None:
    """What the README's placeholder paths point to: a BEIR folder and a
    LoCoMo-shaped file, a few memories each."""
    beir = work / "path" / "to" / "scifact"
    (beir / "qrels").mkdir(parents=True)
    docs = {
        "d1": "Vitamin D deficiency is common in northern latitudes during winter.",
        "d2": "Aspirin lowers the risk of a second heart attack.",
        "d3": "Regular exercise improves sleep quality in older adults.",
    }
    (beir / "corpus.jsonl").write_text(
        "".join(f'{{"_id": "{k}", "title": "", "text": "{v}"}}\n' for k, v in docs.items()), encoding="utf-8")
    (beir / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "does aspirin prevent heart attacks"}\n'
        '{"_id": "q2", "text": "exercise and sleep"}\n', encoding="utf-8")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td3\t1\n", encoding="utf-8")
    import json

    conversation = {
        "speaker_a": "Ann", "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a dog last week."},
            {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice! I start a pottery class tomorrow."},
        ],
    }
    qa = [
        {"question": "What pet did Ann adopt?", "answer": "a dog", "evidence": ["D1:1"], "category": 1},
        {"question": "What class does Bob start?", "answer": "pottery", "evidence": ["D1:2"], "category": 1},
    ]
    (work / "path" / "to" / "locomo10.json").write_text(
        json.dumps([{"sample_id": "conv-1", "conversation": conversation, "qa": qa}]), encoding="utf-8")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIMPLE_")}
    home.mkdir(parents=True)
    env.update(HOME=str(home), PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(VENV_BIN.parent),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    return env


def _read_env(path: Path) -> dict[str, str]:
    """The environment a finished command left (``env -0``)."""
    pairs = (item.split("=", 1) for item in path.read_bytes().decode("utf-8", "replace").split("\0") if "=" in item)
    return {k: v for k, v in pairs if not k.startswith("BASH_FUNC_") and k not in ("_", "__rc", "SHLVL", "PWD", "OLDPWD")}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(step: Step, env: dict[str, str], work: Path, logs: Path, n: int) -> dict[str, str]:
    """Run one command in bash (``set -a``: its assignments carry to the next); the environment after it."""
    out, err, env_file = logs / f"{n:02d}.out", logs / f"{n:02d}.err", logs / f"{n:02d}.env"
    step.stdout = out
    script = f"set -a\n{step.run}\n__rc=$?\nenv -0 > {env_file}\nexit $__rc\n"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=fo, stderr=fe, start_new_session=True)
        t0, cpu0 = time.monotonic(), _children_cpu()
        try:
            rc = proc.wait(step.bound)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            step.outcome = f"still running after {step.bound:.0f} s (stdout {out}, stderr {err})"
            return env
    stderr = err.read_text(encoding="utf-8", errors="replace")
    took = step.seconds = time.monotonic() - t0
    step.cpu_seconds = _children_cpu() - cpu0  # far below the wall time: the command waited on something
    if rc != 0:
        step.outcome = f"exit code {rc} after {took:.1f} s; stderr ends: {stderr[-1500:]!r}"
    elif TRACEBACK in stderr:
        step.outcome = f"a Python traceback on stderr: {stderr[stderr.index(TRACEBACK):][:1500]!r}"
    return _read_env(env_file) if env_file.is_file() else env


def _start(step: Step, env: dict[str, str], work: Path, logs: Path, n: int) -> None:
    out, err = open(logs / f"{n:02d}.out", "wb"), open(logs / f"{n:02d}.err", "wb")
    step.proc = subprocess.Popen(["bash", "-c", step.run], cwd=work, env=env, stdout=out, stderr=err,
                                 start_new_session=True)


WORKER_READY_S = 300.0  # a worker loads its queues' models before its ready line (ingest: torch)


def _wait_ready(step: Step, logs: Path, n: int) -> None:
    """The README says to query once the workers' ready lines appear: wait for this one's."""
    deadline = time.monotonic() + WORKER_READY_S
    while time.monotonic() < deadline and step.proc.poll() is None:
        if any(" ready: queues " in (logs / f"{n:02d}.{s}").read_text(encoding="utf-8", errors="replace")
               for s in ("out", "err")):
            return
        time.sleep(0.5)
    step.outcome = step.outcome or f"no ready line within {WORKER_READY_S:.0f} s (exited: {step.proc.poll()})"


def _answers(port: int, auth: str | None) -> int | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _check_flower(step: Step, env: dict[str, str]) -> None:
    """Flower answers on its port: 401 without the README's credentials, 200 with them."""
    port = int(env["DIMPLE_FLOWER_PORT"])
    user = re.search(r"DIMPLE_FLOWER_USER=(\S+)", step.run).group(1)
    password = re.search(r"DIMPLE_FLOWER_PASSWORD=(\S+)", step.run).group(1)
    deadline = time.monotonic() + DEFAULT_BOUND_S
    while time.monotonic() < deadline and step.proc.poll() is None:
        if _answers(port, None) is not None:
            break
        time.sleep(0.5)
    codes = (_answers(port, None), _answers(port, f"{user}:{password}"))
    if codes != (401, 200):
        step.outcome = f"Flower answered {codes} (without, with credentials); expected (401, 200)"


def _stop(step: Step, logs: Path, n: int) -> None:
    proc = step.proc
    if proc.poll() is not None:
        step.outcome = step.outcome or f"exited early with code {proc.returncode}"
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            step.outcome = step.outcome or "did not stop within 30 s of SIGTERM"
    stderr = (logs / f"{n:02d}.err").read_text(encoding="utf-8", errors="replace")
    if TRACEBACK in stderr and not step.outcome:
        step.outcome = f"a Python traceback on stderr: {stderr[stderr.index(TRACEBACK):][:1500]!r}"


DEMO_HINT = "the demo's try: hint"


def _demo_hint(demo: Step, env: dict[str, str], work: Path, logs: Path) -> Step:
    """The ``try:`` line ``dimple demo`` ends with, run as printed in a shell
    where the venv is not activated (a user who ran the first command only)."""
    hint = Step(demo.section, DEMO_HINT)
    lines = [line for line in demo.stdout.read_text(encoding="utf-8").splitlines() if line.startswith("try: ")]
    if demo.outcome or not lines:
        hint.outcome = "dimple demo failed or printed no 'try:' line"
        return hint
    hint.run = lines[-1].removeprefix("try: ")
    bare = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
    bare["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    _run(hint, bare, work, logs, 99)
    return hint


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory) -> dict[str, Step]:
    """Run every step of the README once, in order; the steps with their outcomes."""
    if not (VENV_BIN / "dimple").is_file():
        pytest.fail(f"no dimple script beside {sys.executable}: install dimple into this venv (bash ops/install.sh)")
    base = tmp_path_factory.mktemp("readme")
    work, logs = base / "work", base / "logs"
    work.mkdir()
    logs.mkdir()
    _tiny_datasets(work)
    env = _env(base / "home")
    env["DIMPLE_FLOWER_PORT"] = str(free_port())
    redis_binary()
    stack = Stack(base / "redis")
    stack.start_redis()
    steps = [replace(s) for s in STEPS]  # copies: the outcomes belong to this run
    started, hint = [], Step("", DEMO_HINT, outcome="dimple demo did not run")
    try:
        for n, step in enumerate(steps):
            if step.skip:
                continue
            step.run = step.run.replace(README_BROKER, stack.broker_url)
            if step.background:
                _start(step, env, work, logs, n)
                started.append((n, step))
                if re.search(r"\bdimple worker\b", step.run):
                    _wait_ready(step, logs, n)
            elif step.run.startswith("dimple demo"):
                # the first command runs .venv/bin/dimple before any `source .venv/bin/activate`
                unactivated = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
                _run(step, unactivated, work, logs, n)
                hint = _demo_hint(step, env, work, logs)
            else:
                env = _run(step, env, work, logs, n)
        for _, step in started:
            if "dimple flower" in step.run and step.proc.poll() is None:
                _check_flower(step, env)
    finally:
        for n, step in started:
            _stop(step, logs, n)
        stack.stop_all()
    (logs / "summary.txt").write_text("".join(
        f"{'-' if s.seconds is None else f'{s.seconds:6.1f}s'} "
        f"{'-' if s.cpu_seconds is None else f'{s.cpu_seconds:6.1f}s cpu'} {'ok' if s.outcome is None else 'FAIL'} {s.key}\n"
        for s in steps if not s.skip), encoding="utf-8")
    return {f"{s.section}: {s.key}": s for s in steps} | {DEMO_HINT: hint}


def _params():
    for step in STEPS:
        marks = []
        if step.key in XFAIL:
            marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[step.key]))
        yield pytest.param(f"{step.section}: {step.key}", marks=marks, id=f"{step.section}: {step.key}"[:110])


def test_the_readme_has_the_blocks_a_new_user_needs():
    sections = {s.section for s in STEPS}
    assert {"The two commands", "Use", "Evaluation (`dimple eval`)", "Running on workers"} <= sections
    assert len({f"{s.section}: {s.key}" for s in STEPS}) == len(STEPS), "two commands with the same first line"
    assert all(s.run.split()[0] != ".venv/bin/dimple" for s in STEPS)
    assert not [k for k in XFAIL if k not in {s.key for s in STEPS}], "an xfail names a command the README lost"
    evaluation = [i for i, s in enumerate(STEPS) if s.section == "Evaluation (`dimple eval`)"]
    use = [i for i, s in enumerate(STEPS) if s.section == "Use"]
    workers = [i for i, s in enumerate(STEPS) if s.section == "Running on workers"]
    assert max(use) < min(evaluation) and max(evaluation) < min(workers), "docs/EVALUATION.md runs between Use and workers"


def test_every_docs_page_with_commands_is_run():
    """A docs page that shows shell commands is run as the README is (or the
    commands it shows could break unseen)."""
    continued = {page for pages in CONTINUED.values() for page in pages}
    with_commands = {str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md")
                     if readme_blocks(p.read_text(encoding="utf-8"))}
    assert with_commands <= continued, f"pages with bash blocks that no test runs: {sorted(with_commands - continued)}"


def test_the_reading_order_inserts_a_page_before_its_section():
    readme = "# dimple\n## Use\n```bash\nuse-1\n```\n## Running on workers\n```bash\nwork-1\n```\n```bash\nwork-2\n```\n"
    page = "# Evaluation\n```bash\neval-1\n```\n### More\n```bash\neval-2\n```\n"
    assert reading_order(readme, {"docs/EVALUATION.md": page}) == [
        ("Use", "use-1"), ("Evaluation", "eval-1"), ("Evaluation", "eval-2"),
        ("Running on workers", "work-1"), ("Running on workers", "work-2")]


def test_a_python_block_is_one_command_fed_to_python():
    readme = "## Use\n```python\nfrom x import y\n\nprint(y(1))  # a comment\n```\n"
    (section, block), = readme_blocks(readme)
    assert section == "Use"
    assert split_commands(block) == ["python - <<'PYTHON'  # from x import y\nfrom x import y\n\n"
                                     "print(y(1))  # a comment\nPYTHON"]
    python_steps = [s for s in STEPS if s.run.startswith("python - <<'PYTHON'")]
    assert len(python_steps) == README.read_text(encoding="utf-8").count("```python")


@pytest.mark.parametrize("key", _params())
def test_readme_command(readme_run, key):
    step = readme_run[key]
    if step.skip:
        pytest.skip(step.skip)
    assert step.outcome is None, f"{step.run!r}: {step.outcome}"


def test_the_demo_hint_runs_as_printed(readme_run):
    hint = readme_run[DEMO_HINT]
    assert hint.outcome is None, f"{hint.run!r}: {hint.outcome}"
