"""Regenerates megatron-flags.txt: every command-line flag Megatron-LM's pretrain_gpt.py
accepts at one tag, read from its source (names only; facts, not code).

Usage: python megatron_flags.py MEGATRON_LM_CHECKOUT TAG > megatron-flags.txt

Megatron-LM's `megatron/training/arguments.py` declares flags two ways: explicit
`add_argument('--name', …)` calls, and `ArgumentGroupFactory(SomeConfig, exclude=[…])`,
which turns every dataclass field `name` into `--name` (a bool that defaults to True into
`--no-name` and `--disable-name`). megatron-core's pip wheel does not ship
`megatron/training`, so `check.py` reads this list instead of importing it.
"""

import ast
import subprocess
import sys

repo, tag = sys.argv[1], sys.argv[2]


def show(path):
    return subprocess.run(["git", "-C", repo, "show", f"{tag}:{path}"], check=True, capture_output=True, text=True).stdout


args_src = show("megatron/training/arguments.py")
tree = ast.parse(args_src)
flags = set()
factories = []  # (class name, excluded fields)
for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                flags.add(a.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ArgumentGroupFactory":
        cls = node.args[0].id
        exclude = set()
        for kw in node.keywords:
            if kw.arg == "exclude":
                if isinstance(kw.value, ast.List):
                    exclude = {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
                elif isinstance(kw.value, ast.Name):
                    # exclude = [...] assigned earlier in the same function
                    for n in ast.walk(tree):
                        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == kw.value.id for t in n.targets) and isinstance(n.value, ast.List):
                            exclude = {e.value for e in n.value.elts if isinstance(e, ast.Constant)}
        factories.append((cls, exclude))

# Where each factory's dataclass lives at this tag.
homes = {
    "TransformerConfig": ["megatron/core/transformer/transformer_config.py", "megatron/core/model_parallel_config.py"],
}


def find_class(name):
    if name in homes:
        return homes[name]
    out = subprocess.run(["git", "-C", repo, "grep", "-l", f"^class {name}\\b", tag, "--", "megatron"], capture_output=True, text=True).stdout
    return [line.split(":", 1)[1] for line in out.splitlines()]


def fields(path, name, seen):
    """Dataclass fields of class `name` in `path`, with its bases' (same file or ModelParallelConfig)."""
    src = ast.parse(show(path))
    out = []
    for node in src.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            for b in node.bases:
                if isinstance(b, ast.Name) and b.id not in seen:
                    seen.add(b.id)
                    for p in find_class(b.id):
                        out += fields(p, b.id, seen)
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    default = item.value
                    names = None  # argparse_meta's arg_names override the derived names
                    init_false = False
                    if isinstance(default, ast.Call):  # field(default=…, metadata=…, init=…)
                        kws = {k.arg: k.value for k in default.keywords}
                        init_false = isinstance(kws.get("init"), ast.Constant) and kws["init"].value is False
                        meta = kws.get("metadata")
                        if isinstance(meta, ast.Dict):
                            for k, v in zip(meta.keys, meta.values):
                                if isinstance(k, ast.Constant) and k.value == "argparse_meta" and isinstance(v, ast.Dict):
                                    for k2, v2 in zip(v.keys, v.values):
                                        if isinstance(k2, ast.Constant) and k2.value == "arg_names" and isinstance(v2, ast.List):
                                            names = [e.value for e in v2.elts]
                        default = kws.get("default")
                    is_true = isinstance(default, ast.Constant) and default.value is True
                    is_bool = isinstance(item.annotation, ast.Name) and item.annotation.id == "bool"
                    if not init_false:
                        out.append((item.target.id, is_bool and is_true, names))
    return out


for cls, exclude in factories:
    for path in find_class(cls)[:1]:
        for name, true_bool, names in fields(path, cls, {cls}):
            if name in exclude or name.startswith("_"):
                continue
            if names:
                flags.update(names)
                continue
            dashed = name.replace("_", "-")
            if true_bool:
                flags.add(f"--no-{dashed}")
                flags.add(f"--disable-{dashed}")
            else:
                flags.add(f"--{dashed}")

print(f"# Megatron-LM {tag}: flags of megatron/training/arguments.py (explicit add_argument calls and")
print("# ArgumentGroupFactory dataclass fields). Generated by megatron_flags.py; names only.")
for f in sorted(flags):
    print(f)
