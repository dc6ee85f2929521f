"""The Lua scripts' KEYS: declared once in Python (``distcrawl.model.lua.KEYS``), and every
script's header must name the same keys in the same order, since a key passed at the wrong
position is not an error in Redis: the script silently reads or writes the wrong key."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest
from redis.crc import key_slot

from distcrawl.model import lua
from distcrawl.model.keys import FrontierKeys

#: ``-- KEYS[3]  seen  SET ...`` and ``-- KEYS[20 ..]  the Bloom filter's keys ...``
HEADER_KEY = re.compile(r"^-- KEYS\[(\d+)\]\s+(\w+)", re.M)
HEADER_TAIL = re.compile(r"^-- KEYS\[(\d+) \.\.\]", re.M)
BODY_KEY = re.compile(r"KEYS\[(\d+)\]")
#: snippets prepended to other scripts, not scripts of their own
SNIPPETS = {"lib", "seen_set", "seen_bloom"}


def scripts() -> list[str]:
    names = [p.name[:-4] for p in files(lua).iterdir() if p.name.endswith(".lua")]
    return sorted(n for n in names if n not in SNIPPETS)


def header(name: str) -> str:
    """The comment block a script starts with."""
    lines = []
    for line in lua.source(name).splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_every_script_file_is_declared_and_every_declaration_has_a_file() -> None:
    assert sorted(lua.KEYS) == scripts()
    assert set(lua.NAMES) <= set(lua.KEYS)


@pytest.mark.parametrize("name", scripts())
def test_the_header_names_the_declared_keys_in_order(name: str) -> None:
    found = HEADER_KEY.findall(header(name))
    assert [int(n) for n, _ in found] == list(range(1, len(found) + 1)), "numbered 1, 2, ..."
    assert tuple(key for _, key in found) == lua.KEYS[name]
    tail = HEADER_TAIL.findall(header(name))
    assert [int(n) for n in tail] in ([], [len(found) + 1]), "extra keys follow the declared"


@pytest.mark.parametrize("name", scripts())
def test_the_body_reads_no_key_beyond_the_header(name: str) -> None:
    body = lua.source(name)[len(header(name)) :]
    used = {int(n) for n in BODY_KEY.findall(body)}
    if not HEADER_TAIL.search(header(name)):
        assert used <= set(range(1, len(lua.KEYS[name]) + 1))


def test_every_declared_name_is_a_key_the_keys_module_builds() -> None:
    members = {n for n in dir(FrontierKeys) if not n.startswith("_")}
    for name, keys in lua.KEYS.items():
        unknown = set(keys) - members - lua.PASSED_BY_CALLER
        assert not unknown, f"{name}.lua: {sorted(unknown)}"


def test_script_keys_pins_the_commit_script_keys() -> None:
    keys = FrontierKeys("site").script_keys("commit", "w1")
    assert len(keys) == lua.COMMIT_KEYS == 22
    assert keys[:6] == [
        "site:queue",
        "site:requests",
        "site:seen",
        "site:seq",
        "site:leases",
        "site:claims:w1",
    ]
    assert keys[13] == "site:throttle:raised"
    assert keys[15] == "site:throttle:state"
    assert keys[18] == "site:wake"
    assert keys[19:] == ["site:revisits", "site:revisit_of", "site:seen:legacy"]


def test_script_keys_takes_the_tag_or_netloc_a_key_is_for() -> None:
    k = FrontierKeys("site")
    assert k.script_keys("claim", "w1")[1:] == ["site:claims:w1", "site:claimants", "site:wake:w1"]
    assert k.script_keys("robots_store", "example.com:8080") == [
        k.robots_txt("example.com:8080"),
        k.robots_lock("example.com:8080"),
    ]
    with pytest.raises(ValueError, match=r"claim\.lua's key 'claims' needs"):
        k.script_keys("claim")


@pytest.mark.parametrize("name", sorted(lua.KEYS))
def test_on_a_cluster_each_script_keys_share_one_hash_slot(name: str) -> None:
    """No CROSSSLOT: every script touches one slot, that of ``<ns>:start_urls``."""
    k = FrontierKeys("site", cluster=True)
    caller_gives_a_key = {"doctor_unrecorded", "doctor_quarantine"}
    keys = k.script_keys(name, k.queue if name in caller_gives_a_key else "w1")
    assert {key_slot(k.encode()) for k in keys} <= {key_slot(b"site:start_urls")}


def test_lib_definitions_cover_all_of_lib_lua() -> None:
    """lib.lua cut at its top-level definitions loses no code line: each one lands in some
    definition (comment lines aside)."""
    code = [
        line
        for line in lua.source("lib").splitlines()
        if line.strip() and not line.lstrip().startswith("--")
    ]
    joined = "\n".join(body for _, body in lua.lib_definitions())
    assert [line for line in code if line not in joined] == []
    names = [name for name, _ in lua.lib_definitions()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", lua.NAMES)
def test_a_script_carries_the_lib_definitions_it_uses_and_no_other(name: str) -> None:
    """A script runs all of its text on every call: lib.lua's functions it never calls are
    not in it, and every one it calls (directly or through another) is, before the script."""
    source = lua.script_source(name)
    own = lua.source(name)
    defined = {n for n, body in lua.lib_definitions() if body in source and body not in own}
    for n, body in lua.lib_definitions():
        used = re.search(rf"\b{n}\b", source.replace(body, "")) is not None
        assert (n in defined) == used, (name, n)
    assert source.endswith(own)
    # a script of few needs stays small: alive.lua takes now_ms() alone
    if name == "alive":
        assert defined == {"now_ms"}


@pytest.mark.valkey
def test_lua_entries_and_ids_are_the_python_layout(redis_client) -> None:
    """lib.lua's make_entry and entry_id (string.char and one '%012x', no tables) build the
    same bytes as queue_entry.make_entry, over priorities and sequence numbers at the edges."""
    from distcrawl.model.queue_entry import make_entry, split_member

    cases = [
        (prio, seq)
        for prio in (-2_147_483_647, -1, 0, 1, 7, 2_147_483_647)
        for seq in (0, 1, 255, 256, 65_535, 2**32 - 1, 2**32, 2**40 + 12_345, 2**48 - 1)
    ]
    script = lua.lib_for("make_entry entry_id") + (
        "\nlocal out = {}\n"
        "for i = 1, #ARGV, 2 do\n"
        "  local e = make_entry('example.com', ARGV[i], tonumber(ARGV[i + 1]), 'pay')\n"
        "  out[#out + 1] = e\n"
        "  out[#out + 1] = entry_id(e)\n"
        "end\n"
        "return out\n"
    )
    args = [str(x) for case in cases for x in case]
    got = redis_client.eval(script, 0, *args)
    for n, (prio, seq) in enumerate(cases):
        entry, ident = got[2 * n], got[2 * n + 1].decode()
        assert entry == make_entry("example.com", prio, seq, b"pay"), (prio, seq)
        assert ident == f"{seq:012x}" == split_member(entry).id, (prio, seq)
