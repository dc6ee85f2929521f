"""docs/internals.md's key table names exactly the keys distcrawl/model/keys.py builds, each with
its Redis type.

Checked rather than generated: the table is prose for operators (links, the layout of a
member, which command touches a key), more than a key's docstring says, and a generated page
would have to be rebuilt by every change to keys.py. The check makes the drift that happened
(``import:queue``, ``import:done``, ``migration`` missing) fail a test instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from distcrawl.model.keys import FrontierKeys, _Key

DOC = Path(__file__).resolve().parent.parent / "docs" / "internals.md"
ROW = re.compile(r"^\| `(<ns>:[^`]+)` \| ([A-Z][A-Za-z ]*[A-Z]) \|", re.MULTILINE)
TYPES = ("STRING", "LIST", "SET", "ZSET", "HASH", "STREAM")
#: keys.py's docstrings call the id counter a counter: a STRING INCR counts in
WORDS = {"Counter": "STRING"}

#: the keys made per worker or per host or per Bloom filter part, by their methods
PARAMETRISED = {
    "claims": lambda k: k.claims("<tag>"),
    "wake_of": lambda k: k.wake_of("<tag>"),
    "robots_txt": lambda k: k.robots_txt("<netloc>"),
    "robots_lock": lambda k: k.robots_lock("<netloc>"),
    "bloom_part": lambda k: k.bloom_part(1, 2).replace(":1:2", ":<layer>:<part>"),
}
PARAMETRISED_TYPES = {
    "claims": "LIST",
    "wake_of": "LIST",
    "robots_txt": "STRING",
    "robots_lock": "STRING",
    "bloom_part": "STRING",
}


def _type_of(doc: str) -> str:
    """The Redis type a key's docstring opens with (``ZSET or LIST: ...`` is both)."""
    words = re.findall(r"[A-Za-z]+", doc)
    first = WORDS.get(words[0], words[0])
    if len(words) > 2 and words[1] == "or" and words[2] in TYPES:
        return f"{first} or {words[2]}"
    return first


def keys_of_keys_py() -> dict[str, str]:
    keys = FrontierKeys("ns")
    found = {"<ns>:start_urls": "LIST"}
    for name, attr in vars(FrontierKeys).items():
        if isinstance(attr, _Key):
            found[f"<ns>:{attr.suffix}"] = _type_of(attr.__doc__ or "")
        elif name in PARAMETRISED:
            key = PARAMETRISED[name](keys)
            found[key.replace("ns:", "<ns>:", 1)] = PARAMETRISED_TYPES[name]
    return found


def keys_of_the_doc() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("## The keys") : text.index("\n## ", text.index("## The keys") + 1)]
    return dict(ROW.findall(table))


def test_every_key_method_is_listed_here():
    """A new per-worker or per-host key method must be added to PARAMETRISED (and the doc)."""
    methods = {
        n
        for n, v in vars(FrontierKeys).items()
        if (callable(v) or isinstance(v, classmethod))
        and not n.startswith("_")
        and n not in PARAMETRISED
    }
    assert methods == {
        "of_crawl",
        "on_cluster",
        "sharded",
        "of_shard",
        "parts",
        "same_key_in",
        "all",
        "script_keys",
    }


def test_every_fixed_key_has_a_redis_type_in_its_docstring():
    for key, kind in keys_of_keys_py().items():
        assert set(kind.split(" or ")) <= set(TYPES), (key, kind)


def test_the_internals_key_table_matches_keys_py():
    doc, code = keys_of_the_doc(), keys_of_keys_py()
    assert sorted(set(code) - set(doc)) == [], "keys.py builds keys the doc does not list"
    assert sorted(set(doc) - set(code)) == [], "the doc lists keys keys.py does not build"
    assert {k: doc[k] for k in code if doc[k] != code[k]} == {}
