"""``distcrawl acl``: the producer and worker users on a real Redis, and a real crawl under them.

The command lists of distcrawl/admin/acl.py are checked against the code (every ``redis.call`` of
the Lua scripts, every redis-py call of the package), and then proved sufficient by real
worker processes that crawl a site through the worker user without a single refused
command (the server's ACL LOG stays empty), and proved tight by a producer that is refused
everything but adding start URLs and reading what ``push`` and ``status`` read.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from distcrawl.admin import acl
from distcrawl.cli import main
from distcrawl.model import lua
from distcrawl.model.connection import make_redis
from distcrawl.model.keys import FrontierKeys
from distcrawl.testing.redis_server import RedisServer
from tests.support import page_fetches, wait_until

PACKAGE = Path(acl.__file__).resolve().parents[1]
SITE = FrontierKeys("site")
PRODUCER_SECRET = "producer-secret-Zq81"
WORKER_SECRET = "worker-secret-Kd27"


# ---------------------------------------------------------------------- derived from the code


def lua_commands() -> set[str]:
    found: set[str] = set()
    for path in sorted((PACKAGE / "model" / "lua").glob("*.lua")):
        text = path.read_text(encoding="utf-8")
        # lib.lua's call_many sends the command it is given, always a literal at its callers
        text = text.replace("redis.call(command, key, unpack(items", "")
        calls = re.findall(r"(?:redis\.p?call|[^_]call_many)\((?!command)", text)
        literal = re.findall(r"(?:redis\.p?call|call_many)\(\s*(['\"])([A-Za-z]+)\1", text)
        # a command name built at run time could not be checked here
        assert len(calls) == len(literal), f"{path.name}: redis.call with a computed name"
        found |= {name.lower() for _, name in literal}
    return found


_RECEIVER = re.compile(r"(^|\.)_?(client|pipe|other|subscription)$|_redis\(\)$")
#: redis-py methods that send no command of their own
_NO_COMMAND = {"close", "execute", "set_retry", "execute_command", "pubsub", "get_message"}
_RENAMED = {
    "delete": "del",
    "script_load": "script|load",
    "scan_iter": "scan",
    "zscan_iter": "zscan",
    "hscan_iter": "hscan",
    "memory_usage": "memory|usage",
    "function_load": "function|load",
    "client_id": "client|id",
    "client_unblock": "client|unblock",
}


#: the administrators' tools, whose own commands (beyond a worker's) are these, never a
#: worker's
ADMIN_MODULES = {
    "importer.py": acl.IMPORT_COMMANDS,
    "migrate.py": acl.MIGRATE_COMMANDS,
    "reshard.py": acl.MIGRATE_COMMANDS,
    "_reshard_copy.py": acl.MIGRATE_COMMANDS,
}


def python_commands(admin: bool | str = False) -> set[str]:
    """Every command distcrawl's Python sends: method calls on its Redis clients and
    pipelines (named ``client``/``pipe``, as everywhere in the package); ``admin``: those of
    the administrators' tools (ADMIN_MODULES) instead, or of the one named."""
    found: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if (path.name in ADMIN_MODULES) != bool(admin) or admin not in (True, False, path.name):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name, receiver = node.func.attr, ast.unparse(node.func.value)
            known = hasattr(redis.client.Pipeline, name) or hasattr(redis.client.PubSub, name)
            if not _RECEIVER.search(receiver) or not known:
                continue
            if name == "pipeline":
                plain = any(
                    k.arg == "transaction"
                    and isinstance(k.value, ast.Constant)
                    and not k.value.value
                    for k in node.keywords
                )
                if not plain:
                    found |= {"multi", "exec"}
            elif name == "register_script":
                found |= {"evalsha", "script|load"}  # redis-py's Script.__call__
            elif name not in _NO_COMMAND:
                found.add(_RENAMED.get(name, name))
    return found | plain_op_commands()


def plain_op_commands() -> set[str]:
    """The commands of plain-command Ops (``Op("", [], ["HINCRBY", ...], parse)``), which a
    batch sends with ``execute_command``: their name is the first of their args."""
    found: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "Op"):
                continue
            script, _, args = node.args[:3]
            if isinstance(script, ast.Constant) and script.value == "":
                assert isinstance(args, ast.List), f"{path.name}: Op args not a list literal"
                name = args.elts[0]
                assert isinstance(name, ast.Constant), f"{path.name}: Op with a computed command"
                found.add(str(name.value).lower())
    return found


def test_lua_commands_are_exactly_those_the_scripts_call():
    assert lua_commands() == set(acl.LUA_COMMANDS)


def test_python_commands_are_exactly_those_the_package_sends():
    found = python_commands()
    extras = {*acl.SCRIPT_COMMANDS, *acl.CONNECTION_COMMANDS, *acl.SETUP_COMMANDS}
    assert found - extras == set(acl.PYTHON_COMMANDS)
    assert set(acl.SCRIPT_COMMANDS) <= found and set(acl.SETUP_COMMANDS) <= found
    sent = found - set(acl.SETUP_COMMANDS) | lua_commands() | set(acl.CONNECTION_COMMANDS)
    # FCALL asks whether the library is loaded (lua.ScriptMode)
    assert set(acl.worker_commands(functions=False)) == sent | set(acl.FUNCTION_COMMANDS)
    # with the function library: FCALL (sent by lua.LuaScript) instead of EVALSHA/SCRIPT LOAD
    functions = sent - set(acl.SCRIPT_COMMANDS) | set(acl.FUNCTION_COMMANDS)
    assert set(acl.worker_commands()) == functions
    assert not {"eval", "evalsha", "script|load", "function|load"} & functions


@pytest.mark.parametrize("module", sorted(ADMIN_MODULES))
def test_the_admin_tools_send_only_worker_commands_and_their_own(module):
    """Each tool's modules send exactly its list between them (``migrate`` is two)."""
    modules = [m for m, own in ADMIN_MODULES.items() if own is ADMIN_MODULES[module]]
    extras = {*acl.SCRIPT_COMMANDS, *acl.CONNECTION_COMMANDS, *acl.PYTHON_COMMANDS}
    found = set().union(*(python_commands(admin=m) for m in modules)) - extras
    assert python_commands(admin=module) - extras <= set(ADMIN_MODULES[module])
    assert found == set(ADMIN_MODULES[module])
    # the worker user gets what its Python and scripts send, not what the tools add
    assert not {"renamenx", "restore", "dump"} & set(acl.worker_commands(cluster=True))


def test_the_scanner_sees_the_calls_it_must_see():
    """Guards the scan itself: a few calls known to be in the package."""
    found = python_commands()
    assert {"info", "zrem", "set", "lrange", "zmscore", "hscan", "multi", "time"} <= found
    assert {"publish", "subscribe"} <= found  # holds.py: a worker's holds channel


# ---------------------------------------------------------------------- output


def acl_output(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["acl", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help(capsys):
    assert main(["acl", "--help"]) == 0
    assert "--producer-password-env" in capsys.readouterr().out


def test_commands_with_placeholders_and_a_note(capsys):
    code, out, err = acl_output(capsys, "site")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    producer, worker = lines
    assert producer.startswith("ACL SETUSER site-producer reset on ><producer-password> ")
    assert worker.startswith("ACL SETUSER site-worker reset on ><worker-password> ")
    assert " %W~site:start_urls " in producer
    assert "%R~site:requests" not in producer and "~site:*" not in producer
    assert " ~site:* ~{site:[0-9]*}:* -@all " in worker
    assert "+fcall" in worker and "+eval" not in worker and "+script" not in worker
    assert "replace <producer-password>" in err and "replace <worker-password>" in err
    # the users of a Redis without distcrawl's function library (Redis 6.2: no functions)
    code, out, _ = acl_output(capsys, "site", "--scripts", "eval")
    worker = out.splitlines()[1]
    assert "+evalsha" in worker and "+script|load" in worker and "+fcall" in worker
    assert "+eval " not in worker + " "


def test_cluster_users_match_the_hash_tagged_names(capsys):
    """On a cluster the keys are ``{site:start_urls}:*`` and ``site:start_urls`` (keys.py):
    the patterns follow, and both users may load the slot map (CLUSTER SLOTS, COMMAND)."""
    code = main(["--cluster", "yes", "acl", "site"])
    producer, worker = capsys.readouterr().out.splitlines()
    assert code == 0
    assert " ~{site:start_urls}:* ~site:start_urls ~{site:[0-9]*}:* -@all " in worker
    assert "~site:*" not in worker
    assert " %W~site:start_urls " in producer and " %R~{site:start_urls}:queue " in producer
    for user in (producer, worker):
        assert "+cluster|slots" in user and "+command" in user
    assert main(["acl", "site"]) == 0  # single server: as before
    assert "+cluster|slots" not in capsys.readouterr().out


def test_password_env_prints_the_hash_never_the_password(capsys, monkeypatch):
    monkeypatch.setenv("P_PW", PRODUCER_SECRET)
    monkeypatch.setenv("W_PW", WORKER_SECRET)
    argv = ["site", "--producer-password-env", "P_PW", "--worker-password-env", "W_PW"]
    for extra in ([], ["--json"], ["--format", "aclfile"]):
        code, out, err = acl_output(capsys, *argv, *extra)
        assert code == 0
        for secret in (PRODUCER_SECRET, WORKER_SECRET):
            assert secret not in out + err
        assert "#" + hashlib.sha256(WORKER_SECRET.encode()).hexdigest() in out
        assert "note:" not in err


def test_missing_password_variable_is_a_usage_error_naming_it(capsys, monkeypatch):
    monkeypatch.delenv("NOPE_PW", raising=False)
    code, out, err = acl_output(capsys, "site", "--worker-password-env", "NOPE_PW")
    assert code == 2
    assert out == ""
    assert "NOPE_PW" in err and "--worker-password-env" in err


def test_json_and_aclfile_forms(capsys):
    code, out, _ = acl_output(capsys, "site", "--json", "--worker-user", "crawler")
    assert code == 0
    data = json.loads(out)
    assert data["namespace"] == "site"
    roles = {u["role"]: u for u in data["users"]}
    assert roles["worker"]["user"] == "crawler"
    assert roles["worker"]["command"].startswith("ACL SETUSER crawler reset ")
    assert roles["producer"]["password_placeholder"] is True
    code, out, _ = acl_output(capsys, "site", "--format", "aclfile", "--namespace", "ns2")
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["user", "ns2-producer"],
        ["user", "ns2-worker"],
    ]
    assert "~ns2:*" in out and "site" not in out


def test_user_names_that_cannot_be_written_are_refused(capsys):
    code, _, err = acl_output(capsys, "site", "--producer-user", 'a"b')
    assert code == 2
    assert "producer user" in err


# ---------------------------------------------------------------------- on a real Redis


def user_url(redis_server: RedisServer, user: str, password: str) -> str:
    return f"redis://{quote(user)}:{quote(password)}@127.0.0.1:{redis_server.port}/0"


def create_users(capsys, monkeypatch, redis_server: RedisServer, *argv: str) -> tuple[str, str]:
    """The users as an operator creates them: ``distcrawl acl ... | redis-cli``."""
    monkeypatch.setenv("T_PRODUCER_PW", PRODUCER_SECRET)
    monkeypatch.setenv("T_WORKER_PW", WORKER_SECRET)
    code, out, _ = acl_output(
        capsys,
        "site",
        "--producer-user",
        "prod",
        "--worker-user",
        "work",
        "--producer-password-env",
        "T_PRODUCER_PW",
        "--worker-password-env",
        "T_WORKER_PW",
        *argv,
    )
    assert code == 0
    done = subprocess.run(
        ["redis-cli", "-p", str(redis_server.port)],
        input=out.encode(),
        capture_output=True,
        timeout=10,
        check=True,
    )
    assert done.stdout.split() == [b"OK", b"OK"], done.stdout + done.stderr
    return (
        user_url(redis_server, "prod", PRODUCER_SECRET),
        user_url(redis_server, "work", WORKER_SECRET),
    )


def acl_denials(redis_client: redis.Redis) -> list[dict]:
    return [entry for entry in redis_client.acl_log() if entry.get("username") != "default"]


def test_producer_adds_start_urls_and_nothing_else(capsys, monkeypatch, redis_server, redis_client):
    producer_url, _ = create_users(capsys, monkeypatch, redis_server)
    redis_client.hset(SITE.settings, "max_pending", 4)
    redis_client.zadd(SITE.queue, {b"kept": 0})
    redis_client.hset(SITE.requests, b"r1", b"Authorization: secret")
    producer = redis.Redis.from_url(producer_url)
    try:
        assert producer.lpush(SITE.start_urls, b"http://a.example/") == 1
        assert producer.rpush(SITE.start_urls, b"http://b.example/") == 2
        assert main(["--redis-url", producer_url, "push", "site", "http://c.example/"]) == 0
        # the pending cap (queue 1 + start_urls 3 = 4) is read and enforced
        assert main(["--redis-url", producer_url, "push", "site", "http://d.example/"]) == 4
        assert main(["--redis-url", producer_url, "--json", "status", "site"]) == 0
        capsys.readouterr()
        assert main(["--redis-url", producer_url, "--json", "status", "site"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["queue"], status["start_urls"]) == (1, 3)
        assert acl_denials(redis_client) == []

        attempts = {
            "queue": lambda: producer.zadd(SITE.queue, {b"evil": 0}),
            "queue removal": lambda: producer.zrem(SITE.queue, b"kept"),
            "requests": lambda: producer.hset(SITE.requests, b"r2", b"x"),
            "read requests": lambda: producer.hgetall(SITE.requests),
            "seen": lambda: producer.sadd(SITE.seen, b"fp"),
            "bloom": lambda: producer.hset(SITE.bloom, b"layers", 0),
            "bloom bits": lambda: producer.setbit(SITE.bloom_part(0, 0), 7, 1),
            "dead letters": lambda: producer.lpush(SITE.dead, b"{}"),
            "settings": lambda: producer.hset(SITE.settings, "max_pending", 10**9),
            "pause": lambda: producer.set(SITE.paused, b"1"),
            "limits": lambda: producer.hset(SITE.limits, b"a.example", b"0:100"),
            "robots": lambda: producer.set(SITE.robots_txt("a.example"), b"0 200\n"),
            "take start_urls": lambda: producer.lpop(SITE.start_urls),
            "delete start_urls": lambda: producer.delete(SITE.start_urls),
            "other crawl": lambda: producer.lpush("other:start_urls", b"http://x.example/"),
            "other key": lambda: producer.set("anything", b"1"),
            "eval": lambda: producer.eval("return 1", 0),
            "script load": lambda: producer.script_load("return 1"),
            "evalsha": lambda: producer.evalsha("0" * 40, 0),
            "keys": lambda: producer.keys("*"),
            "flushall": producer.flushall,
            "config": lambda: producer.config_get("requirepass"),
        }
        for what, attempt in attempts.items():
            try:
                attempt()
            except redis.exceptions.NoPermissionError:
                continue
            pytest.fail(f"producer could {what}")
    finally:
        producer.close()
    assert redis_client.zrange(SITE.queue, 0, -1) == [b"kept"]
    assert redis_client.hgetall(SITE.requests) == {b"r1": b"Authorization: secret"}
    assert redis_client.exists(SITE.seen, SITE.bloom, SITE.dead, SITE.paused, "anything") == 0


def test_worker_is_held_to_its_namespace(capsys, monkeypatch, redis_server, redis_client):
    _, worker_url = create_users(capsys, monkeypatch, redis_server)
    worker = redis.Redis.from_url(worker_url)
    try:
        worker.hset(SITE.stats, b"pages", 1)
        worker.publish(SITE.holds, b"{}")  # its crawl's one channel
        for attempt in (
            lambda: worker.hset("other:stats", b"pages", 1),
            lambda: worker.lpush("other:start_urls", b"http://x.example/"),
            lambda: worker.publish("other:holds", b"{}"),
            lambda: worker.publish("site:other", b"{}"),
            lambda: worker.eval("return 1", 0),
            lambda: worker.script_load("return 1"),
            lambda: worker.evalsha("0" * 40, 0),
            lambda: worker.function_load(
                "#!lua name=x\nredis.register_function('x', function() return 1 end)"
            ),
            lambda: worker.keys("*"),
            worker.flushall,
            lambda: worker.config_set("appendonly", "no"),
            lambda: worker.acl_setuser("x"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        worker.close()


@pytest.mark.parametrize("namespace", ["we*ird", "site:eu", "s?te", "{site"])
def test_a_namespace_a_pattern_could_not_hold_to_itself_is_refused(capsys, namespace):
    """A glob character, ``:`` or a brace in a crawl name would give its users, or another
    crawl's, keys that are not theirs (tests/test_acl_scope.py): no users are printed."""
    code, out, err = acl_output(capsys, "site", "--namespace", namespace)
    assert (code, out) == (2, "")
    assert f"invalid spider/namespace {namespace!r}: a crawl name may not contain" in err


def test_a_netloc_in_a_key_pattern_matches_only_itself():
    """A crawl's name holds no glob character; a host's may (``[::1]``): escaped."""
    assert acl.key_pattern(SITE.robots_txt("[::1]:8080")) == "site:robotstxt:\\[::1\\]:8080"


class AclFileRedis(RedisServer):
    def __init__(self, aclfile: Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.aclfile = aclfile

    def command(self) -> list[str]:
        return [*super().command(), "--aclfile", str(self.aclfile)]


def test_aclfile_form_loads_into_the_same_users(capsys, monkeypatch, redis_server, tmp_path):
    create_users(capsys, monkeypatch, redis_server)
    code, out, _ = acl_output(
        capsys,
        "site",
        "--producer-user",
        "prod",
        "--worker-user",
        "work",
        "--producer-password-env",
        "T_PRODUCER_PW",
        "--worker-password-env",
        "T_WORKER_PW",
        "--format",
        "aclfile",
    )
    assert code == 0
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\n" + out)
    with AclFileRedis(aclfile, directory=tmp_path / "aclfile-redis") as other:
        loaded, created = other.client(), redis_server.client()
        try:
            for name in ("prod", "work"):
                from_file, from_cli = loaded.acl_getuser(name), created.acl_getuser(name)
                for user in (from_file, from_cli):
                    user["commands"] = sorted(user["commands"])
                    # a selector's commands come back in the order of a hash table
                    for selector in user["selectors"]:
                        selector[1] = sorted(selector[1].split())
                assert from_file == from_cli
            assert loaded.acl_getuser("prod")["selectors"]  # the file kept the selector
        finally:
            loaded.close()
            created.close()


@pytest.mark.parametrize("scripts", ["functions", "eval"])
def test_crawl_through_the_worker_user(
    scripts, capsys, monkeypatch, demo_site, workers, redis_server, redis_client
):
    """Bloom seen-set, monitor, robots.txt, retries, status and doctor, all under the
    least-privilege users: every page is fetched and Redis refuses nothing. With the function
    library loaded (``distcrawl setup``) the worker user has FCALL and no EVALSHA or SCRIPT;
    without it (``--scripts eval``, as on Redis 6.2) EVALSHA and SCRIPT LOAD."""
    producer_url, worker_url = create_users(capsys, monkeypatch, redis_server, "--scripts", scripts)
    if scripts == "functions":
        assert main(["--redis-url", redis_server.url, "setup"]) == 0
        assert lua.library_version() in capsys.readouterr().out
    site = demo_site(pages=120, fail_rate=0.3)
    assert main(["--redis-url", producer_url, "push", "site", site.url + "/"]) == 0
    settings = {
        "REDIS_URL": worker_url,
        "DISTCRAWL_SEEN": "bloom",
        "DISTCRAWL_IDLE_TIMEOUT": 5,
        # the 503s stand for failing pages, not for an overloaded host (see test_retry)
        "DISTCRAWL_THROTTLE_HTTP_CODES": "429",
    }
    pool = [workers(i, **settings) for i in (1, 2)]
    assert wait_until(lambda: len(page_fetches(site)) >= 20, timeout=60)
    assert main(["--redis-url", producer_url, "status", "site"]) == 0
    assert main(["--redis-url", worker_url, "status", "site"]) == 0
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]

    assert set(page_fetches(site)) == site.expected_pages()
    log = site.read_log()
    assert any(line.path == "/robots.txt" for line in log)
    assert not any(line.path.startswith("/private/") for line in log)
    assert sum(1 for line in log if line.status == 503) >= 10  # retries really happened
    assert redis_client.exists(SITE.bloom) == 1 and redis_client.exists(SITE.seen) == 0
    assert redis_client.hlen(SITE.workers) == 2  # the monitor's heartbeats
    assert int(redis_client.hget(SITE.stats, "pages") or 0) >= len(site.expected_pages())
    assert redis_client.llen(SITE.dead) == 0

    capsys.readouterr()
    assert main(["--redis-url", worker_url, "--json", "status", "site"]) == 0
    assert json.loads(capsys.readouterr().out)["queue"] == 0
    assert main(["--redis-url", worker_url, "doctor", "site"]) == 0
    said = "Lua: distcrawl's function library" if scripts == "functions" else "Lua: scripts sent"
    for w in pool:
        text = w.log() + w.log_path.with_suffix(".stderr").read_text()
        assert "NOPERM" not in text and "NoPermission" not in text
        assert WORKER_SECRET not in text
        assert text.count(said) == 1
    assert acl_denials(redis_client) == []
    calls = redis_client.info("commandstats")
    if scripts == "functions":
        assert calls["cmdstat_fcall"]["calls"] > 100 and "cmdstat_evalsha" not in calls
    else:
        assert calls["cmdstat_evalsha"]["calls"] > 100


def test_make_redis_sends_no_client_subcommand(redis_proxy):
    """redis-py sends CLIENT SETINFO (and, over RESP3, CLIENT MAINT_NOTIFICATIONS) on
    connect; distcrawl's clients do not, so neither user needs a CLIENT subcommand (which
    Redis < 7.2 would not even accept in ACL SETUSER)."""
    sent: list[bytes] = []
    redis_proxy.drop_reply_once(lambda args: sent.append(b" ".join(args[:2]).upper()) and False)
    plain = redis.Redis.from_url(redis_proxy.url)
    ours = make_redis(redis_proxy.url)
    try:
        plain.ping()
        assert b"CLIENT SETINFO" in sent  # what the check would see
        sent.clear()
        ours.ping()
        assert b"PING" in sent
        assert [c for c in sent if c.startswith(b"CLIENT")] == []
    finally:
        plain.close()
        ours.close()
        redis_proxy.disarm()


@pytest.mark.parametrize(
    ("denied", "logged"),
    [
        # INFO is @dangerous and often denied: only the memory check may go with it
        ("info", "WARNING: Redis refused INFO"),
        # a grant missing for the monitor: said once, not taken for an outage that passes
        ("zincrby", "ERROR: Heartbeat refused by Redis"),
    ],
)
def test_monitor_under_a_user_missing_a_command_says_so(
    denied, logged, capsys, monkeypatch, demo_site, workers, redis_server, redis_client
):
    monkeypatch.setenv("W_PW", WORKER_SECRET)
    code, out, _ = acl_output(capsys, "site", "--worker-password-env", "W_PW", "--json")
    assert code == 0
    rules = json.loads(out)["users"][1]["rules"]
    redis_client.execute_command("ACL", "SETUSER", "w", "reset", *rules, f"-{denied}")
    lua.load_library(redis_client)  # the user may FCALL only
    site = demo_site(pages=20)
    redis_client.lpush(SITE.start_urls, site.url + "/")
    worker_url = user_url(redis_server, "w", WORKER_SECRET)
    w = workers(1, REDIS_URL=worker_url, DISTCRAWL_IDLE_TIMEOUT=3)
    assert w.wait(120) == 0, w.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    assert w.log().count(logged) == 1, w.log()[-3000:]
    assert redis_client.hlen(SITE.workers) == 1  # the heartbeat went on
    assert {entry["object"] for entry in acl_denials(redis_client)} == {denied}
