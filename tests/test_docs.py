"""Documentation of the public API and of the plugin hooks, and that every hook is exercised."""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import inspect
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvcodec_sdk
from kvcodec_sdk import hookspecs
from kvcodec_sdk.codecs import concat as concat_plugin

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as a package, where installed
    tomllib = None

SPEC_ATTR = f"{hookspecs.PROJECT_NAME}_spec"
IMPL_ATTR = f"{hookspecs.PROJECT_NAME}_impl"
HOOKS = sorted(name for name, obj in vars(hookspecs).items() if callable(obj) and hasattr(obj, SPEC_ATTR))
ROLE = re.compile(r":(?:class|meth|func|attr|exc|mod|data):`~?([\w.]+)`")


def test_there_are_hooks():
    assert HOOKS == ["kvcodec_register_codecs"]


@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_documents_every_argument(hook):
    func = getattr(hookspecs, hook)
    doc = inspect.getdoc(func)
    assert doc and len(doc.splitlines()[0]) > 10, f"{hook} needs a docstring with a summary line"
    args = list(inspect.signature(func).parameters)
    documented = re.findall(r":param (\w+):\s*\S", doc)
    assert sorted(documented) == sorted(args), f"{hook}: args {args}, documented {documented}"


def _resolve(target: str, owner) -> object:
    """Resolves a Sphinx cross-reference as written in ``owner``'s docstring."""
    module = inspect.getmodule(owner)
    candidates = [target]
    if module is not None:
        candidates.append(f"{module.__name__}.{target}")
        if inspect.isclass(owner):
            candidates.append(f"{module.__name__}.{owner.__qualname__}.{target}")
        elif "." in getattr(owner, "__qualname__", ""):
            candidates.append(f"{module.__name__}.{owner.__qualname__.rsplit('.', 1)[0]}.{target}")
    for dotted in candidates:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return obj
    raise LookupError(target)


def _documented_objects():
    """Hookspecs, public names of kvcodec_sdk, and the public methods of its public classes."""
    out = [(f"hookspecs.{h}", getattr(hookspecs, h)) for h in HOOKS]
    for name in kvcodec_sdk.__all__:
        obj = getattr(kvcodec_sdk, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        out.append((name, obj))
        if inspect.isclass(obj) and obj.__module__.startswith("kvcodec_sdk"):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(func):
                    out.append((f"{name}.{attr}", func))
    return out


def test_public_names_resolve():
    for name in kvcodec_sdk.__all__:
        assert hasattr(kvcodec_sdk, name), f"kvcodec_sdk.__all__ lists {name!r}, which does not exist"
    assert len(set(kvcodec_sdk.__all__)) == len(kvcodec_sdk.__all__)


@pytest.mark.parametrize("name, obj", _documented_objects(), ids=[n for n, _ in _documented_objects()])
def test_public_api_is_documented(name, obj):
    doc = obj.__doc__  # not inspect.getdoc: an inherited docstring does not document a subclass
    assert doc and doc.strip(), f"{name} has no docstring"
    for target in ROLE.findall(doc):
        try:
            _resolve(target, obj)
        except LookupError:
            pytest.fail(f"{name}'s docstring refers to {target!r}, which does not resolve")


def test_module_docstrings():
    for module in ("kvcodec_sdk", "kvcodec_sdk.hookspecs", "kvcodec_sdk.registry", "kvcodec_sdk.codec",
                   "kvcodec_sdk.layout", "kvcodec_sdk.spec", "kvcodec_sdk.errors", "kvcodec_sdk.codecs.concat"):
        assert (importlib.import_module(module).__doc__ or "").strip(), module


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_implemented_by_a_builtin_plugin(hook):
    impl = getattr(concat_plugin, hook, None)
    assert impl is not None and hasattr(impl, IMPL_ATTR), f"no built-in plugin implements {hook}"
    spec_args = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert list(inspect.signature(impl).parameters) == spec_args


def test_every_hook_is_called_by_the_registry():
    reg = kvcodec_sdk.CodecRegistry(load_entry_points=False)
    calls = []
    probe = type("Probe", (), {})()
    for hook in HOOKS:
        def record(registry, _hook=hook):
            calls.append((_hook, registry))
        record.__name__ = hook
        setattr(probe, hook, kvcodec_sdk.hookimpl(record))
    reg.register_plugin(probe, "probe")
    assert [s.name for s in reg.list_codecs()] == ["concat"]  # the concat plugin's hook registered it
    assert calls == [(hook, reg) for hook in HOOKS]
    reg.list_codecs()
    assert len(calls) == len(HOOKS), "hooks run once per registry"


# --- The documentation's pages: every code block executed or type-checked, paths that exist -----

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts) + [REPO / "README.md"] + sorted(
    REPO.glob("plugins/*/README.md"))
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
#: Pages whose Python blocks run top to bottom in one namespace: they are complete programs.
EXECUTED = {"getting-started.md", "tutorials/engine.md", "tutorials/operator.md"}
#: Roots a page's relative repository path may be relative to: the repository, each plugin and the template.
PATH_ROOTS = [REPO, *sorted(REPO.glob("plugins/*/")), REPO / "templates/codec-plugin/{{cookiecutter.distribution_name}}"]
REPO_PATH = re.compile(r"`((?:csrc|kvcodec_sdk|plugins|templates|tests|scripts|examples|docs|shared|\.ci)/[^`\s]*)`")


def _toml(text: str) -> dict:
    if tomllib is None:
        pytest.skip("tomllib is Python >= 3.11")
    return tomllib.loads(text)


def _page_name(page: Path) -> str:
    return page.relative_to(DOCS).as_posix() if DOCS in page.parents else page.relative_to(REPO).as_posix()


def _blocks(lang: str | None = None) -> list[tuple[str, int, str, str]]:
    """(page, line, language, body) of every fenced block; ``{directive}`` fences are Sphinx's."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            info = m["info"].strip().split(" ")[0]
            body = "\n".join(line[len(m["indent"]):] for line in m["body"].splitlines())
            if info.startswith("{") or (lang is not None and info != lang):
                continue
            out.append((_page_name(page), text.count("\n", 0, m.start()) + 1, info or "text", body))
    return out


def _ids(blocks):
    return [f"{page}:{line}" for page, line, _, _ in blocks]


KNOWN_LANGUAGES = {"python", "bash", "text", "cpp", "cmake", "toml"}


def test_every_block_has_a_checked_language():
    """A block of another language would go unchecked: add its check below first."""
    blocks = _blocks()
    assert len(blocks) > 40
    assert {lang for _, _, lang, _ in blocks} <= KNOWN_LANGUAGES, sorted({b[2] for b in blocks} - KNOWN_LANGUAGES)


EXEC_BLOCKS = [b for b in _blocks("python") if b[0] in EXECUTED]


@pytest.mark.parametrize("page", sorted(EXECUTED))
def test_executed_pages_run(page, tmp_path, monkeypatch):
    blocks = [b for b in EXEC_BLOCKS if b[0] == page]
    assert blocks, f"{page} has no Python block"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for _, line, _, body in blocks:
        exec(compile(body, f"{page}:{line}", "exec"), namespace)  # noqa: S102 - the docs' own examples


class _Fragment(ast.NodeTransformer):
    """``...`` as a value means "whatever fits" in a fragment: it becomes an Any-typed name. Names
    the package imports lazily are imported from the modules that define them (the package's
    ``__getattr__`` would make them Any), and relative imports (a plugin's own ``_ext``) are Any."""

    def visit_Expr(self, node):
        return node if isinstance(node.value, ast.Constant) and node.value.value is Ellipsis else self.generic_visit(node)

    def visit_Constant(self, node):
        return ast.Name("_ANY_", ast.Load()) if node.value is Ellipsis else node

    def visit_Call(self, node):
        """``f(..., x=1)``: the arguments not shown, as a mapping of any keys."""
        self.generic_visit(node)
        if any(isinstance(a, ast.Name) and a.id == "_ANY_" for a in node.args):
            node.args = [a for a in node.args if not (isinstance(a, ast.Name) and a.id == "_ANY_")]
            node.keywords.append(ast.keyword(None, ast.Name("_ANY_", ast.Load())))
        return node

    def visit_ImportFrom(self, node):
        if node.level:
            return [ast.AnnAssign(ast.Name(a.asname or a.name, ast.Store()), ast.Name("Any", ast.Load()), None, 1)
                    for a in node.names]
        if node.module != "kvcodec_sdk":
            return node
        lazy = kvcodec_sdk._LAZY
        out = [ast.ImportFrom(f"kvcodec_sdk.{lazy[a.name]}", [a], 0) for a in node.names if a.name in lazy]
        rest = [a for a in node.names if a.name not in lazy]
        return out + ([ast.ImportFrom("kvcodec_sdk", rest, 0)] if rest else [])


def _free_names(tree: ast.AST) -> set[str]:
    bound, loaded = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound


def _page_module(blocks: list[tuple[str, int, str, str]]) -> tuple[str, list[tuple[int, str]]]:
    """A page's Python fragments, in order, as one module mypy can check (a later block uses what an
    earlier one defined, as a reader does); free names are Any. Returns the source and the first
    line of each block in it."""
    bodies = [ast.unparse(ast.fix_missing_locations(_Fragment().visit(ast.parse(b[3])))) for b in blocks]
    free = sorted((_free_names(ast.parse("\n".join(bodies))) - {"Any"}) | {"_ANY_"})
    lines = ["from typing import Any", *(f"{name}: Any" for name in free)]
    starts = []
    for block, body in zip(blocks, bodies):
        starts.append((len(lines) + 1, f"{block[0]}:{block[1]}"))
        lines += body.splitlines()
    return "\n".join(lines) + "\n", starts


def test_fragments_type_check(tmp_path):
    """Python blocks that are fragments (free names, ``...``) are type-checked against the installed
    package with mypy: every name, attribute, keyword and argument count of the SDK they use."""
    api = pytest.importorskip("mypy.api")
    blocks = [b for b in _blocks("python") if b[0] not in EXECUTED]
    assert len(blocks) >= 10
    starts = {}
    for i, page in enumerate(sorted({b[0] for b in blocks})):
        source, starts[f"page_{i}.py"] = _page_module([b for b in blocks if b[0] == page])
        (tmp_path / f"page_{i}.py").write_text(source)
    # union-attr: the manager's migrations are typed MigrationResult | PendingMigration whatever
    # ``blocking`` is (no overload on it yet), so a documented ``pending.wait()`` cannot type-check.
    out, err, status = api.run(["--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
                                "--disable-error-code=union-attr",
                                "--cache-dir", str(tmp_path / ".mypy_cache"), *map(str, sorted(tmp_path.glob("page_*.py")))])
    problems = []
    for line in out.splitlines():
        if ": error:" in line:
            file, number, message = line.split(":", 2)
            where = ([w for start, w in starts[Path(file).name] if start <= int(number)] or [f"{file} (prelude)"])[-1]
            problems.append(f"{where}: {message.strip()}")
    assert status == 0 and not problems, "\n".join(problems) or err


def _commands(body: str) -> list[list[str]]:
    """The command lines of a shell block as argument lists (comments and continuations handled)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for part in " ".join(shlex.quote(w) if w not in ("&&", ";") else w for w in words).split(" && "):
            if part.strip():
                out.append(shlex.split(part))
    return out


def _parse_cli(argv: list[str]) -> None:
    """Parses a documented command line; folders it names are the reader's (``/var/lib/kv``), so
    only whether one exists here is not checked."""
    import kvcodec_sdk.commands
    from kvcodec_sdk.cli import build_parser

    modules = [importlib.import_module(f"kvcodec_sdk.commands.{n}") for n in kvcodec_sdk.commands.COMMANDS]
    saved = [(m, m.folder) for m in modules if hasattr(m, "folder")]
    try:
        for module, _ in saved:
            module.folder = str
        args, extra = build_parser().parse_known_args(argv)
    finally:
        for module, folder in saved:
            module.folder = folder
    assert not extra, f"kvcodec {' '.join(argv)}: unrecognized {extra}"


def _pytest_options() -> set[str]:
    from kvcodec_sdk.testing import plugin

    options: set[str] = set()
    group = type("Group", (), {"addoption": lambda self, *names, **kw: options.update(names)})()
    plugin.pytest_addoption(type("Parser", (), {"getgroup": lambda self, *a, **k: group})())
    return options


TEMPLATE = REPO / "templates/codec-plugin/{{cookiecutter.distribution_name}}"


def _check_pip(argv: list[str], scaffolded: set[str]) -> None:
    assert argv[:2] == ["pip", "install"], argv
    for word in argv[2:]:
        if word.startswith("-") or word == "cibuildwheel" or not (word.startswith(".") or "/" in word):
            continue  # an option or a package from an index
        folder, _, extras = word.partition("[")
        # A plugin `kvcodec new` made earlier on the page is the template's project.
        pyproject = (TEMPLATE if Path(folder).name in scaffolded else REPO / folder) / "pyproject.toml"
        assert pyproject.is_file(), f"pip install {word}: {folder} is no project folder of this repository"
        text = pyproject.read_text()
        if pyproject.parent == TEMPLATE:  # Jinja, not TOML yet: the extras' names as written
            section = text.partition("[project.optional-dependencies]")[2].partition("\n[")[0]
            declared = dict.fromkeys(re.findall(r"^([\w-]+) = ", section, re.M))
        else:
            declared = _toml(text)["project"].get("optional-dependencies", {})
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in declared, f"pip install {word}: {folder} has no extra {extra!r}"


def _check_command(argv: list[str], scaffolded: set[str]) -> None:
    program, args = argv[0], argv[1:]
    if program == "kvcodec":
        _parse_cli(args)
        if args[:1] == ["new"]:
            answers = dict(a.split("=", 1) for a in args if "=" in a)
            scaffolded.add(answers.get("distribution_name", f"kvcodec-{answers.get('codec_name', 'byteplane')}"))
    elif program == "pip":
        _check_pip(argv, scaffolded)
    elif program == "pytest":
        known = _pytest_options()
        for word in args:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"pytest {word}: the kvcodec pytest plugin has no such option"
            elif not word.startswith("-") and "/" in word:
                assert (REPO / word).exists(), f"pytest {word}: no such path"
    elif program in ("python", "python3"):
        assert (REPO / args[0]).is_file(), f"{program} {args[0]}: no such script"
    elif program == "sphinx-build":
        assert {"-W", "-n", "--keep-going"} <= set(args) and (REPO / "docs" / "conf.py").is_file()
    elif program == "cibuildwheel":
        folders = [a for a in args if not a.startswith("-") and a != "wheelhouse"]
        assert all((REPO / f / "pyproject.toml").is_file() for f in folders), folders
    else:
        assert program == "export" or "=" in program, f"no check for the command {program!r}: add one"


@pytest.mark.parametrize("page, line, lang, body", _blocks("bash"), ids=_ids(_blocks("bash")))
def test_shell_blocks(page, line, lang, body):
    """Shell blocks parse as shell, and each command is checked against what it names: a ``kvcodec``
    command line by the real parser, a ``pip install`` by the folders and extras of this repository."""
    subprocess.run(["bash", "-n"], input=body, text=True, check=True)
    commands = _commands(body)
    assert commands
    scaffolded: set[str] = set()
    for earlier in _blocks("bash"):  # the page's blocks up to this one, in order
        if earlier[0] == page and earlier[1] < line:
            for argv in _commands(earlier[3]):
                if argv[:2] == ["kvcodec", "new"]:
                    _check_command(argv, scaffolded)
    for argv in commands:
        _check_command(argv, scaffolded)


SYNOPSIS = re.compile(r"^(?:\$ )?kvcodec(?: [a-z][\w-]*)*")


@pytest.mark.parametrize("page, line, lang, body", _blocks("text"), ids=_ids(_blocks("text")))
def test_text_blocks(page, line, lang, body):
    """Text blocks are output and diagrams, except ``kvcodec`` lines: a synopsis names only options
    its command has, and a ``$ kvcodec`` line is run and prints the line that follows it."""
    from kvcodec_sdk.cli import build_parser

    lines = body.splitlines()
    for i, text in enumerate(lines):
        m = SYNOPSIS.match(text)
        if not m:
            continue
        words = m.group(0).removeprefix("$ ").split()[1:]
        parser = build_parser()
        for word in words:  # the deepest subcommand the line names
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs or word not in subs[0].choices:
                break
            parser = subs[0].choices[word]
        known = {o for a in parser._actions for o in a.option_strings}
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", text.split("#")[0]):
            assert option in known, f"{page}:{line}: {parser.prog} has no option {option}"
        if text.startswith("$ ") and "without a GPU" not in text or (
                "without a GPU" in text and kvcodec_sdk._native.driver_info()["device_count"] == 0):
            run = subprocess.run([sys.executable, "-m", "kvcodec_sdk", *shlex.split(text[2:], comments=True)[1:]],
                                 capture_output=True, text=True, timeout=120, cwd=REPO.parent)
            assert lines[i + 1] in (run.stdout + run.stderr).splitlines(), (text, run.stderr)


@pytest.mark.parametrize("page, line, lang, body", _blocks("cpp"), ids=_ids(_blocks("cpp")))
def test_cpp_blocks_compile(page, line, lang, body, tmp_path):
    """C++ blocks compile (syntax and types) against the installed headers; a block's own
    undefined functions are declared with the factory's signatures."""
    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    cuda = [f"-I{p}" for p in ("/usr/local/cuda/include",) if Path(p).is_dir()]
    prelude = ("#include <kvcodec/codec_base.h>\n"
               "kvcodec::IKvCacheColdPageCodec* createMyCodec(char const*, int32_t, char*, size_t);\n"
               "void destroyMyCodec(kvcodec::IKvCacheColdPageCodec*);\n")
    source = tmp_path / "block.cpp"
    source.write_text(prelude + body + "\n")
    run = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", f"-I{kvcodec_sdk.get_include()}", *cuda, str(source)],
                         capture_output=True, text=True)
    assert run.returncode == 0, f"{page}:{line}\n{run.stderr}"


@pytest.mark.parametrize("page, line, lang, body", _blocks("cmake"), ids=_ids(_blocks("cmake")))
def test_cmake_blocks_name_installed_targets(page, line, lang, body):
    package = Path(kvcodec_sdk.get_cmake_dir())
    exported = "\n".join(p.read_text() for p in package.glob("*.cmake"))
    assert re.search(r"find_package\(kvcodec_sdk\b", body)
    for target in re.findall(r"\bkvcodec_sdk::\w+", body):
        assert target in exported, f"{page}:{line}: {target} is not a target of the installed CMake package"


@pytest.mark.parametrize("page, line, lang, body", _blocks("toml"), ids=_ids(_blocks("toml")))
def test_toml_blocks(page, line, lang, body):
    data = _toml(body)
    groups = data.get("project", {}).get("entry-points", {})
    assert groups, f"{page}:{line}: no entry points"
    assert set(groups) <= {hookspecs.PROJECT_NAME, "pytest11", "cmake.prefix"}, groups


def _inline_paths() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        prose = FENCE.sub("", page.read_text())
        out += [(_page_name(page), m.group(1).rstrip(".,:;)")) for m in REPO_PATH.finditer(prose)]
    return out


def test_paths_named_in_the_docs_exist():
    """A repository path in a page's prose exists (in the repository, a plugin or the template)."""
    missing = []
    for page, path in _inline_paths():
        pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", path)
        if not any(list(root.glob(pattern)) if "*" in pattern else (root / pattern).exists() for root in PATH_ROOTS):
            missing.append(f"{page}: {path}")
    assert not missing, "\n".join(missing)


def test_getting_started_shows_the_readme_commands():
    readme = next(b for b in _blocks("bash") if b[0] == "README.md")[3]
    started = next(b for b in _blocks("bash") if b[0] == "getting-started.md")[3]
    assert started == readme


def test_every_public_name_is_on_an_api_page():
    pages = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    documented = set(re.findall(r"^\.\. (?:auto)?(?:class|function|exception|data|module):: ([\w.]+)", pages, re.M))
    short = {name.rsplit(".", 1)[-1] for name in documented}
    missing = [n for n in kvcodec_sdk.__all__ if n not in short]
    assert not missing, f"public names on no API page: {missing}"
    assert "kvcodec_sdk.testing" in documented and ":imported-members:" in pages


def test_every_page_is_in_the_site():
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"^([\w/-]+)$", index, re.M))
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")
             if "_build" not in p.parts and p.parent == DOCS or p.parent.name == "tutorials"}
    assert pages - {"index"} <= listed, sorted(pages - listed - {"index"})


def test_ci_builds_the_docs_strictly():
    ci = (REPO / ".ci" / "run").read_text()
    build = next((line for line in ci.splitlines() if "sphinx-build" in line and not line.startswith("#")), "")
    assert {"-E", "-W", "-n", "--keep-going"} <= set(build.split()) and "timeout" in build, build
    assert '["optional-dependencies"]["docs"]' in ci
    pins = _toml((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    assert all("==" in pin for pin in pins) and any(p.startswith("sphinx==") for p in pins)


def test_the_site_builds_strictly(tmp_path):
    """The whole site with warnings as errors (what .ci/run runs): a stale reference fails here."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html",
                          str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
