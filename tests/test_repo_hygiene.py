"""The tracked files speak of the software, not of how it was developed: no numbered work sessions or periods,
throwaway variants, scratch folders, issue numbers, machine-lending terms or commit hashes in prose. History
belongs in git. A hit names the file, the line and the pattern.

The Python files stay small enough to read: no file over MAX_FILE_LINES lines and no function or method over
MAX_FUNCTION_LINES, except the kernel files in KERNEL_FILES and their @triton.jit / @gluon.jit functions."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Text the project writes: code, docs, configs, scripts (data files such as tokenizers and result JSON are not prose).
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".ini", ".cfg", ".toml", ".txt", ".sbatch", ""}

PATTERNS = {
    "a numbered work session": r"\bsessions? \d+|\bsession-\d+|\b(?:this|next|the) session(?:'s)?\b(?! of its own)",
    "a numbered work period": r"\b(?:work )?periods? \d+\b",
    "a throwaway variant": r"\bthrowaway\b",
    "a scratch folder outside the repo": r"(?<![\w./-])ab/",
    "an issue number": r"\bissues? #?\d+\b",
    "a machine-lending term": r"\blent (?:GPU )?machines?\b|\blending\b|\bnvidia-h[12]00(?:-x\d)?\b|\bdevice call\b",
    "a tried-and-dropped diary entry": r"\btried (?:and (?:reverted|not kept)|in (?:session|period))\b",
    "a commit hash in prose": r"\bcommits? \(?[0-9a-f]{7,40}\b|\bat commit\b|\breverted (?:by|in) [0-9a-f]{7}",
    "a stale re-run note": r"\bnot re-run since\b",
    "a project-goal scorecard": r"\bstretch goals?\b|\bthe goals? of\b",
}
COMPILED = {name: re.compile(p, re.IGNORECASE) for name, p in PATTERNS.items()}


def tracked_text_files():
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in out.stdout.splitlines():
        path = ROOT / rel
        if rel == THIS or Path(rel).suffix not in SUFFIXES or not path.is_file():
            continue
        try:
            yield rel, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def hits(text):
    """(line number, pattern name, line) of every match in ``text``."""
    for n, line in enumerate(text.splitlines(), 1):
        for name, rx in COMPILED.items():
            if rx.search(line):
                yield n, name, line.strip()


def test_tracked_files_do_not_describe_the_development_process():
    found = [f"{rel}:{n}: {name}: {line[:160]}" for rel, text in tracked_text_files() for n, name, line in hits(text)]
    assert not found, "development-process words in tracked files:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "docs/benchmarks.md, session 15", "sessions 18 and 19", "## Session 26: where the time goes", "this session",
    "the session's last device minutes", "tried in period 3", "a throwaway patch", "timed against `ab/cur`",
    "(issue 3)", "issue #12", "the lent GPU machines", "kind `nvidia-h200-x2`", "in one device call",
    "Tried and reverted (session 7)", "at commit 7bc8a61", "(commits b37fb78 and a5d0b3a)", "not re-run since",
    "the stretch goal: 340 TFLOP/s", "the goals of issue 3",
])
def test_patterns_catch_process_words(line):
    assert list(hits(line)), line


@pytest.mark.parametrize("line", [
    '@pytest.fixture(scope="session")', "torchrun starts each rank in a session of its own",
    "the last periodic checkpoint", "a tab/space mix", "dtype=torch.float32 (see lab/ and slab/)",
    "fla-org/flash-linear-attention#640", "triton-lang/triton#11366", "commit `a0b16d35a9851168`",
    "it has not been measured", "the checkpoint tried next", "the output is silent", "lentil",
])
def test_patterns_leave_ordinary_words_alone(line):
    assert not list(hits(line)), line


MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80  # from the ``def`` line to the last line, docstring included, decorators not

# Files whose bulk is compiled GPU kernels. A kernel body is one compiled program: its loops, pipelining and
# register lifetimes are read as a whole, so its length is exempt, and so is the file's. Their plain Python
# functions are held to the limit like any other.
KERNEL_FILES = {
    "forgetting_transformer/ops/forgetting_attention/triton/kernels.py":
        "the Triton forward, backward and prefix-sum kernels",
    "forgetting_transformer/ops/forgetting_attention/gluon/kernels.py":
        "the Gluon (Hopper) kernels and their warp-specialized partitions",
}


def tracked_python_files():
    for rel, text in tracked_text_files():
        if rel.endswith(".py"):
            yield rel, text


def is_kernel(node):
    """``@triton.jit``, ``@gluon.jit``, ``@triton.jit(...)`` and the like."""
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def functions(tree, prefix=""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, prefix + node.name + ".")
        else:
            yield from functions(node, prefix)


def size_violations(rel, text):
    """'file: N lines' and 'file:function: N lines' for what is over the limits in one file."""
    kernel_file = rel in KERNEL_FILES
    n_lines = len(text.splitlines())
    if n_lines > MAX_FILE_LINES and not kernel_file:
        yield f"{rel}: {n_lines} lines (> {MAX_FILE_LINES})"
    for name, node in functions(ast.parse(text, filename=rel)):
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES and not (kernel_file and is_kernel(node)):
            yield f"{rel}:{name}: {length} lines (> {MAX_FUNCTION_LINES})"


def test_python_files_and_functions_stay_within_the_size_limits():
    found = [v for rel, text in tracked_python_files() for v in size_violations(rel, text)]
    assert not found, "over the size limits (split into named helpers):\n" + "\n".join(found)


def test_every_kernel_file_entry_names_a_tracked_file():
    tracked = {rel for rel, _ in tracked_python_files()}
    assert not set(KERNEL_FILES) - tracked, set(KERNEL_FILES) - tracked


def test_size_check_names_file_function_and_length():
    def body(indent):
        return "".join(f"{indent}x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))

    text = ("class A:\n    def long(self):\n" + body(" " * 8) + "def short():\n    return 1\n"
            "@triton.jit\ndef kernel():\n" + body(" " * 4))
    too_long = f"{MAX_FUNCTION_LINES + 1} lines (> {MAX_FUNCTION_LINES})"
    assert list(size_violations("pkg/m.py", text)) == [f"pkg/m.py:A.long: {too_long}", f"pkg/m.py:kernel: {too_long}"]
    kernel_file = next(iter(KERNEL_FILES))
    assert list(size_violations(kernel_file, text)) == [f"{kernel_file}:A.long: {too_long}"]
    assert list(size_violations("pkg/big.py", "x = 1\n" * (MAX_FILE_LINES + 1))) == [
        f"pkg/big.py: {MAX_FILE_LINES + 1} lines (> {MAX_FILE_LINES})"]


def test_test_modules_have_unique_names():
    """pytest imports test modules by file name (the test dirs are not packages): two test files of one name in
    different folders stop the whole suite at collection."""
    names = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not clashes, f"test files sharing a name: {clashes}"
