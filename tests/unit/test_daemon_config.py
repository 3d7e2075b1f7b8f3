import argparse

import pytest

from cairn.daemon.service.config import FIELDS, ConfigError, Settings, add_arguments, default_socket_path, load_settings


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_defaults_match_the_issue():
    s = load_settings({}, {"XDG_RUNTIME_DIR": "/run/user/1000"})
    assert (s.segment, s.chunk, s.checkpoint_slots, s.checkpoint_min_tokens) == (4096, 128, 64, 512)
    assert s.checkpoints is True and s.disk_checkpoints is False and s.tcp is None
    assert s.socket == "/run/user/1000/cairn/cairn.sock" and s.socket_mode_int == 0o660


def test_socket_default_order():
    assert default_socket_path({"RUNTIME_DIRECTORY": "/run/cairn", "XDG_RUNTIME_DIR": "/x"}) == "/run/cairn/cairn.sock"
    assert default_socket_path({}).startswith("/tmp/cairn-")


def test_precedence_flag_over_env_over_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('segment = 2048\nchunk = 64\nqueue_size = 3\ncheckpoints = false\n')
    s = load_settings(parse(["--config", str(cfg), "--chunk", "32"]), {"CAIRN_SEGMENT": "1024"})
    assert (s.chunk, s.segment, s.queue_size, s.checkpoints) == (32, 1024, 3, False)
    assert load_settings(parse(["--no-checkpoints"]), {}).checkpoints is False
    assert load_settings({}, {"CAIRN_DISK_CHECKPOINTS": "yes"}).disk_checkpoints is True


def test_every_setting_has_flag_env_and_key():
    names = {f.name for f in FIELDS}
    assert names == set(Settings.__slots__)
    assert {"checkpoints", "checkpoint_slots", "checkpoint_memory_mb", "disk_checkpoints", "checkpoint_dir",
            "checkpoint_disk_mb", "checkpoint_min_tokens", "segment", "chunk", "queue_size", "threads",
            "served_model_name", "log_level", "max_tokens_default"} <= names


@pytest.mark.parametrize("flags, env, text, words", [
    ({"chunk": "0"}, {}, None, ["'chunk'", "flag --chunk", ">= 1"]),
    ({}, {"CAIRN_CHUNK": "abc"}, None, ["'chunk'", "CAIRN_CHUNK", "not an integer"]),
    ({}, {"CAIRN_CHECKPOINTS": "maybe"}, None, ["'checkpoints'", "true/false"]),
    ({}, {}, "chunk = 'big'", ["'chunk'", "config file", "not an integer"]),
    ({}, {}, "chunks = 3", ["unknown setting", "chunks", "allowed"]),
    ({}, {}, "chunk = ", ["not valid TOML"]),
    ({"tcp": "0.0.0.0:8000"}, {}, None, ["'tcp'", "loopback", "--api-key"]),
    ({"tcp": "nohost"}, {}, None, ["'tcp'", "HOST:PORT"]),
    ({"log_level": "loud"}, {}, None, ["'log_level'", "debug, info"]),
    ({"checkpoint_slots": "4097"}, {}, None, ["'checkpoint_slots'", "1 to 4096"]),
    ({"segment": "64", "chunk": "128"}, {}, None, ["'segment'", "chunk"]),
])
def test_errors_name_the_setting_source_and_allowed(tmp_path, flags, env, text, words):
    if text is not None:
        f = tmp_path / "c.toml"
        f.write_text(text)
        flags = {**flags, "config": str(f)}
    with pytest.raises(ConfigError) as e:
        load_settings(flags, env)
    for w in words:
        assert w in str(e.value)


def test_chunk_checked_against_kernel_max_chunk():
    with pytest.raises(ConfigError, match="MAX_CHUNK"):
        load_settings({"chunk": "600"}, {}, max_chunk=512)
    assert load_settings({"chunk": "512"}, {}, max_chunk=512).chunk == 512


def test_tcp_non_loopback_allowed_with_api_key():
    s = load_settings({"tcp": "0.0.0.0:8000", "api_key": "k"}, {})
    assert s.tcp_host_port == ("0.0.0.0", 8000)


def test_checkpoint_dir_defaults_to_the_state_directory_never_the_cache():
    from cairn.daemon.service.config import default_checkpoint_dir

    assert default_checkpoint_dir({"STATE_DIRECTORY": "/var/lib/cairn:/other", "CACHE_DIRECTORY": "/c"}) \
        == "/var/lib/cairn/checkpoints"
    assert default_checkpoint_dir({"XDG_STATE_HOME": "/h/.st", "CACHE_DIRECTORY": "/c"}) == "/h/.st/cairn/checkpoints"
    assert default_checkpoint_dir({"HOME": "/home/u"}) == "/home/u/.local/state/cairn/checkpoints"
    assert load_settings({}, {"HOME": "/home/u"}).checkpoint_dir == "/home/u/.local/state/cairn/checkpoints"


def test_packed_cache_dir_is_a_setting_defaulting_to_the_cache_directory():
    from cairn.daemon.service.config import default_packed_cache_dir

    assert default_packed_cache_dir({"CACHE_DIRECTORY": "/var/cache/cairn:/x"}) == "/var/cache/cairn/packed"
    assert default_packed_cache_dir({"XDG_CACHE_HOME": "/h/.c"}) == "/h/.c/cairn/packed"
    assert load_settings({}, {"HOME": "/home/u"}).packed_cache_dir == "/home/u/.cache/cairn/packed"
    assert load_settings({}, {"HOME": "/home/u", "CAIRN_PACKED_CACHE_DIR": "/srv/packed"}).packed_cache_dir \
        == "/srv/packed"


@pytest.mark.parametrize("mode", ["0666", "0777", "0662"])
def test_world_writable_socket_mode_is_refused(mode):
    with pytest.raises(ConfigError, match="without write permission for others"):
        load_settings(parse(["--socket-mode", mode]), {})
    assert load_settings(parse(["--socket-mode", "0770"]), {}).socket_mode_int == 0o770


def test_socket_not_placed_in_a_directory_others_can_write(tmp_path):
    import os

    from cairn.daemon.api.server import _unix_socket

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)                      # like a /tmp/cairn-$UID pre-made by someone else
    with pytest.raises(OSError, match="is writable by group and others"):
        _unix_socket(str(shared / "cairn.sock"), 0o660)
    link = tmp_path / "link"
    link.symlink_to(shared)
    with pytest.raises(OSError, match="symlink"):
        _unix_socket(str(link / "cairn.sock"), 0o660)
    own = tmp_path / "own"
    sock = _unix_socket(str(own / "cairn.sock"), 0o660)   # created here, 0750: fine
    assert (os.stat(own / "cairn.sock").st_mode & 0o777) == 0o660
    sock.close()


def test_systemd_passed_tcp_socket_off_loopback_needs_an_api_key():
    import socket

    from cairn.daemon.api.server import check_inherited

    with socket.socket() as public, socket.socket() as local:
        public.bind(("0.0.0.0", 0))
        local.bind(("127.0.0.1", 0))
        check_inherited([local], None)
        check_inherited([public], "secret")
        with pytest.raises(OSError, match="not loopback; set api_key"):
            check_inherited([local, public], None)


def test_api_key_file_is_read_stripped_and_an_unusable_one_is_a_clear_error(tmp_path):
    key = tmp_path / "api_key"
    key.write_text("  s3cret \n")
    s = load_settings({"api_key_file": str(key), "tcp": "0.0.0.0:8000"}, {})
    assert s.api_key == "s3cret"                     # and it satisfies the non-loopback check
    assert load_settings({}, {"CAIRN_API_KEY_FILE": str(key)}).api_key == "s3cret"
    (tmp_path / "empty").write_text("\n")
    for flags, env, words in [({"api_key_file": str(tmp_path / "empty")}, {}, ["api_key_file", "empty"]),
                              ({"api_key_file": str(tmp_path / "nope")}, {}, ["api_key_file", "cannot read",
                                                                            "No such file"]),
                              ({"api_key_file": str(key)}, {"CAIRN_API_KEY": "k"}, ["both set", "one of them"])]:
        with pytest.raises(ConfigError) as e:
            load_settings(flags, env)
        assert all(w in str(e.value) for w in words), str(e.value)


def test_max_tokens_default_is_unset_meaning_the_rest_of_the_context_and_an_operator_may_set_it():
    assert load_settings({}, {"XDG_RUNTIME_DIR": "/run/user/1000"}).max_tokens_default is None
    assert load_settings({"max_tokens_default": 2048}, {"XDG_RUNTIME_DIR": "/run/user/1000"}).max_tokens_default == 2048
