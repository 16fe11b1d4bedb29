from api.cli import build_parser, progress_bar


def test_progress_bar_shows_done_total_and_percent():
    assert progress_bar({"done": 0, "total": 0}, width=10) == "[..........]       0/0   0%"
    assert progress_bar({"done": 700, "total": 1400}, width=10) == "[#####.....]     700/1400  50%"
    assert progress_bar({"done": 1400, "total": 1400}, width=10) == "[##########]    1400/1400 100%"


def test_every_documented_command_exists():
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"up", "worker", "api", "remember", "search", "get", "jobs", "status", "keys"} <= set(commands)


def test_search_leaves_rerank_to_the_server_unless_told():
    parse = build_parser().parse_args
    assert parse(["search", "q", "--user-id", "u"]).rerank is None
    assert parse(["search", "q", "--user-id", "u", "--rerank"]).rerank is True
    assert parse(["search", "q", "--user-id", "u", "--no-rerank"]).rerank is False
