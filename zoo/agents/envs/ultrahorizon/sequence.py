"""UltraHorizon *Sequence Exploration* (arXiv:2509.21766; rules as in the official ``envs/seq_env/env.py``).

``input_sequences(main, vice)`` takes two strings of exactly 5 letters from A-E, each with at least 2 distinct
letters; each valid call costs one step (``n`` = the step number after the increment). Five chained rules
transform the pair and every intermediate result is shown. HARD rules (``n`` = step number):

* R1 interleave main and vice, main first when ``n`` is odd, vice first when even (length 10);
* R2 ``shift(reverse(cur)) + shift(cur)``, each letter shifted by ``+n`` modulo 26 (length 20);
* R3 append ``cur[a-1]`` repeated ``a`` times, ``a = n mod 10`` with 0 read as 10 (length 20 + a);
* R4 add the *previous* call's main string to the first 5 letters (alphabet positions, modulo 26); at ``n = 1``
  there is no previous call and the string is unchanged;
* R5 when ``n`` is prime, replace the most frequent letter (the first one seen on ties) by the next letter.

EASY rules: interleave (main first); add positions ``main[i] + vice[i]`` (no modulo); per-position maximum; the
"main if main >= vice else vice" comparison (the same function as the maximum); sort ``main + vice``.
The environment has no randomness (the seed only names the instance). As in the official code, ``medium`` uses
the HARD rules, and ``get_game_info``/``get_history`` are not tools (they carry no "[agent tool]" marker there);
``history_tools=True`` exposes them.

The rules are entries of a declared library (:data:`SEQ_RULES`), which is also the commit vocabulary: the
structured commit names one rule id per stage. Each stage earns 20 points; under HARD the official judge text
splits R1 into 5 points for "interleaving" and 15 for the step-parity lead, reproduced by ``rule1_split=True``
(default; ``False`` scores R1 all or nothing).

equation -> function: stage rule -> :data:`SEQ_RULES` ``[id].apply(SeqContext)``; per-difficulty chain ->
:data:`STAGE_RULES`; validation -> :func:`validate_sequence`; rubric -> :meth:`SequenceExploration.score_commit`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.agents.envs.base import RubricItem, RuleMappingEnvironment
from zoo.agents.tools import agent_tool

ALPHABET = ("A", "B", "C", "D", "E")
STAGES = ("rule_1", "rule_2", "rule_3", "rule_4", "rule_5")


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % d for d in range(2, int(n**0.5) + 1))


def validate_sequence(sequence: str) -> str | None:
    """Why ``sequence`` is not a valid input (``None`` when valid): 5 letters of A-E, at least 2 distinct."""
    if len(sequence) != 5:
        return f"Sequence must be exactly 5 characters. Got {len(sequence)}"
    for i, char in enumerate(sequence):
        if char not in ALPHABET:
            return f"Invalid character '{char}' at position {i}. Use only: {', '.join(ALPHABET)}"
    if len(set(sequence)) < 2:
        return f"Sequence must contain at least 2 different letters. Got {len(set(sequence))}: {sorted(set(sequence))}"
    return None


@dataclass(frozen=True)
class SeqContext:
    """Inputs of a stage: the running string, the call's inputs, the step number, the previous call's inputs."""

    current: str
    main: str
    vice: str
    n: int
    last_main: str = ""
    last_vice: str = ""


@dataclass(frozen=True)
class SeqRule:
    id: str
    description: str
    apply: Callable[[SeqContext], str]
    #: the rule as an answer expression over :data:`ANSWER_VARIABLES`
    formula: str = "cur"


def _letter(value: int) -> str:
    return chr(ord("A") + value)


def _val(char: str) -> int:
    return ord(char) - ord("A")


def _interleave(first: str, second: str) -> str:
    return "".join(a + b for a, b in zip(first, second))


def _shift(text: str, k: int) -> str:
    # the official code shifts only letters of the input alphabet A-E (all letters at this stage)
    return "".join(_letter((_val(c) + k) % 26) if c in ALPHABET else c for c in text)


def _append_char(c: SeqContext, a: int) -> str:
    return c.current + c.current[a - 1] * a if len(c.current) > a - 1 else c.current


def _step_mod_10(n: int) -> int:
    return n % 10 or 10


def _add_prefix(current: str, other: str) -> str:
    if not other or not current:
        return current
    head = "".join(_letter((_val(a) + _val(b)) % 26) for a, b in zip(current[:5], other))
    return head + current[5:]


def _bump(current: str, alphabetical: bool = False) -> str:
    counts: dict[str, int] = {}
    for char in current:
        if char.isalpha():
            counts[char] = counts.get(char, 0) + 1
    if not counts:
        return current
    best = max(sorted(counts) if alphabetical else counts, key=lambda ch: counts[ch])
    return current.replace(best, _letter((_val(best) + 1) % 26))


# answer expressions of the library rules (what a scripted agent writes when it commits a rule)
_N = "(len(history) + 1)"  # the step number
_A = f"({_N} % 10 or 10)"
_PRIME = f"{_N} > 1 and all({_N} % d for d in range(2, {_N}))"
_PREVIOUS = ("(history[-1][0] if history else '')", "(history[-1][1] if history else '')")


def _shift_formula(k: str, text: str) -> str:
    return f"''.join(chr(65 + (ord(c) - 65 + {k}) % 26) if c in 'ABCDE' else c for c in {text})"


def _add_to_first_5(other: str) -> str:
    added = f"''.join(chr(65 + (ord(a) + ord(b) - 130) % 26) for a, b in zip(cur[:5], {other}))"
    return f"{added} + cur[5:] if {other} and cur else cur"


def _bump_formula(condition: str, pool: str = "cur") -> str:
    bumped = f"[cur.replace(m, chr(65 + (ord(m) - 64) % 26)) for m in [max({pool}, key=cur.count)]][0]"
    return f"{bumped} if cur and {condition} else cur"


def _interleave_formula(main_first_when: str) -> str:
    return f"''.join(a + b if {main_first_when} else b + a for a, b in zip(main, vice))"


_FORMULAS: dict[str, str] = {
    "identity": "cur",
    "interleave_main_first": _interleave_formula("True"),
    "interleave_vice_first": _interleave_formula("False"),
    "interleave_main_first_on_odd_step": _interleave_formula("len(history) % 2 == 0"),
    "interleave_main_first_on_even_step": _interleave_formula("len(history) % 2 == 1"),
    "concat_main_vice": "main + vice",
    "add_positions": "''.join(chr(ord(a) + ord(b) - 65) for a, b in zip(main, vice))",
    "add_positions_mod_5": "''.join(chr(65 + (ord(a) + ord(b) - 130) % 5) for a, b in zip(main, vice))",
    "max_per_position": "''.join(max(a, b) for a, b in zip(main, vice))",
    "min_per_position": "''.join(min(a, b) for a, b in zip(main, vice))",
    "reverse_shift_step_then_shift_step": _shift_formula(_N, "cur[::-1] + cur"),
    "reverse_shift_1_then_shift_1": _shift_formula("1", "cur[::-1] + cur"),
    "shift_step_then_reverse_shift_step": _shift_formula(_N, "cur + cur[::-1]"),
    "reverse_then_string": "cur[::-1] + cur",
    "append_char_at_step_mod_10": f"cur + cur[{_A} - 1] * {_A} if len(cur) >= {_A} else cur",
    "append_first_char_step_mod_10": f"cur + cur[:1] * {_A}",
    "append_char_at_step": f"cur + cur[{_N} - 1] * {_N} if len(cur) >= {_N} else cur",
    "add_previous_main_to_first_5": _add_to_first_5(_PREVIOUS[0]),
    "add_main_to_first_5": _add_to_first_5("main"),
    "add_previous_vice_to_first_5": _add_to_first_5(_PREVIOUS[1]),
    "sort_main_vice": "''.join(sorted(main + vice))",
    "sort_string": "''.join(sorted(cur))",
    "prime_step_bump_most_frequent": _bump_formula(_PRIME),
    "prime_step_bump_most_frequent_alphabetical": _bump_formula(_PRIME, "sorted(cur)"),
    "odd_step_bump_most_frequent": _bump_formula("len(history) % 2 == 0"),
    "always_bump_most_frequent": _bump_formula("True"),
}


def _rules() -> dict[str, SeqRule]:
    rules = [
        SeqRule("identity", "the string is unchanged", lambda c: c.current),
        SeqRule(
            "interleave_main_first", "interleave main and vice, main first", lambda c: _interleave(c.main, c.vice)[:10]
        ),
        SeqRule("interleave_vice_first", "interleave main and vice, vice first", lambda c: _interleave(c.vice, c.main)),
        SeqRule(
            "interleave_main_first_on_odd_step",
            "interleave main and vice; main first when the step number is odd, vice first when even",
            lambda c: _interleave(c.main, c.vice) if c.n % 2 == 1 else _interleave(c.vice, c.main),
        ),
        SeqRule(
            "interleave_main_first_on_even_step",
            "interleave main and vice; main first when the step number is even, vice first when odd",
            lambda c: _interleave(c.main, c.vice) if c.n % 2 == 0 else _interleave(c.vice, c.main),
        ),
        SeqRule("concat_main_vice", "main followed by vice", lambda c: c.main + c.vice),
        SeqRule(
            "add_positions",
            "letter i = main[i] + vice[i] in alphabet positions (A=0), no wrap-around",
            lambda c: "".join(_letter(_val(a) + _val(b)) for a, b in zip(c.main, c.vice)),
        ),
        SeqRule(
            "add_positions_mod_5",
            "letter i = (main[i] + vice[i]) mod 5 in alphabet positions (A=0)",
            lambda c: "".join(_letter((_val(a) + _val(b)) % 5) for a, b in zip(c.main, c.vice)),
        ),
        SeqRule(
            "max_per_position",
            "letter i = the later of main[i] and vice[i]",
            lambda c: "".join(map(max, c.main, c.vice)),
        ),
        SeqRule(
            "min_per_position",
            "letter i = the earlier of main[i] and vice[i]",
            lambda c: "".join(map(min, c.main, c.vice)),
        ),
        SeqRule(
            "reverse_shift_step_then_shift_step",
            "reverse the string and shift each letter forward by the step number (mod 26), then append the string "
            "shifted the same way",
            lambda c: _shift(c.current[::-1], c.n) + _shift(c.current, c.n),
        ),
        SeqRule(
            "reverse_shift_1_then_shift_1",
            "reverse the string and shift each letter forward by 1, then append the string shifted by 1",
            lambda c: _shift(c.current[::-1], 1) + _shift(c.current, 1),
        ),
        SeqRule(
            "shift_step_then_reverse_shift_step",
            "shift each letter forward by the step number, then append the reversed string shifted the same way",
            lambda c: _shift(c.current, c.n) + _shift(c.current[::-1], c.n),
        ),
        SeqRule(
            "reverse_then_string", "the reversed string followed by the string", lambda c: c.current[::-1] + c.current
        ),
        SeqRule(
            "append_char_at_step_mod_10",
            "a = step number mod 10 (0 counts as 10); append the a-th letter of the string a times",
            lambda c: _append_char(c, _step_mod_10(c.n)),
        ),
        SeqRule(
            "append_first_char_step_mod_10",
            "a = step number mod 10 (0 counts as 10); append the first letter of the string a times",
            lambda c: c.current + c.current[:1] * _step_mod_10(c.n),
        ),
        SeqRule(
            "append_char_at_step",
            "a = step number; append the a-th letter of the string a times",
            lambda c: _append_char(c, c.n),
        ),
        SeqRule(
            "add_previous_main_to_first_5",
            "add the previous input's main string to the first 5 letters (alphabet positions, mod 26); unchanged at "
            "the first step",
            lambda c: _add_prefix(c.current, c.last_main),
        ),
        SeqRule(
            "add_main_to_first_5",
            "add this input's main string to the first 5 letters (alphabet positions, mod 26)",
            lambda c: _add_prefix(c.current, c.main),
        ),
        SeqRule(
            "add_previous_vice_to_first_5",
            "add the previous input's vice string to the first 5 letters (alphabet positions, mod 26); unchanged at "
            "the first step",
            lambda c: _add_prefix(c.current, c.last_vice),
        ),
        SeqRule(
            "sort_main_vice",
            "sort the letters of main + vice alphabetically",
            lambda c: "".join(sorted(c.main + c.vice)),
        ),
        SeqRule("sort_string", "sort the letters of the string alphabetically", lambda c: "".join(sorted(c.current))),
        SeqRule(
            "prime_step_bump_most_frequent",
            "when the step number is prime, every occurrence of the most frequent letter (first seen wins ties) "
            "becomes the next letter (mod 26); otherwise unchanged",
            lambda c: _bump(c.current) if is_prime(c.n) else c.current,
        ),
        SeqRule(
            "prime_step_bump_most_frequent_alphabetical",
            "when the step number is prime, the most frequent letter (alphabetically first wins ties) becomes the "
            "next letter; otherwise unchanged",
            lambda c: _bump(c.current, alphabetical=True) if is_prime(c.n) else c.current,
        ),
        SeqRule(
            "odd_step_bump_most_frequent",
            "when the step number is odd, the most frequent letter (first seen wins ties) becomes the next letter",
            lambda c: _bump(c.current) if c.n % 2 == 1 else c.current,
        ),
        SeqRule(
            "always_bump_most_frequent",
            "the most frequent letter (first seen wins ties) becomes the next letter",
            lambda c: _bump(c.current),
        ),
    ]
    return {r.id: SeqRule(r.id, r.description, r.apply, _FORMULAS[r.id]) for r in rules}


#: the hypothesis library = the commit vocabulary of every stage
SEQ_RULES: dict[str, SeqRule] = _rules()

#: official chains (the code's rule_1..5 for EASY, rule_6..10 for HARD; MEDIUM falls through to HARD)
STAGE_RULES: dict[str, tuple[str, ...]] = {
    "easy": ("interleave_main_first", "add_positions", "max_per_position", "max_per_position", "sort_main_vice"),
    "hard": (
        "interleave_main_first_on_odd_step",
        "reverse_shift_step_then_shift_step",
        "append_char_at_step_mod_10",
        "add_previous_main_to_first_5",
        "prime_step_bump_most_frequent",
    ),
}
STAGE_RULES["medium"] = STAGE_RULES["hard"]
INTERLEAVE_FAMILY = tuple(k for k in SEQ_RULES if k.startswith("interleave_"))


def _safe(function: Callable[[dict[str, Any]], Any], case: dict[str, Any]) -> Any:
    try:
        return function(case)
    except Exception:
        return None


def run_chain(
    rules: tuple[str, ...], main: str, vice: str, n: int, last_main: str = "", last_vice: str = ""
) -> list[str]:
    """The intermediate string after each stage."""
    current, out = "", []
    for rule in rules:
        current = SEQ_RULES[rule].apply(SeqContext(current, main, vice, n, last_main, last_vice))
        out.append(current)
    return out


ANSWER_VARIABLES = ("cur", "main", "vice", "history")


def _answer_cases() -> list[dict[str, Any]]:
    """Inputs an answer is checked on: for each of the first 40 inputs of a game, 5 random main/vice pairs after
    a random history of earlier pairs (fixed seed)."""
    rng = random.Random(20250926)

    def draw() -> str:
        while True:
            text = "".join(rng.choice(ALPHABET) for _ in range(5))
            if validate_sequence(text) is None:
                return text

    return [
        {"main": draw(), "vice": draw(), "history": [[draw(), draw()] for _ in range(n - 1)]}
        for n in range(1, 41)
        for _ in range(5)
    ]


ANSWER_CASES: list[dict[str, Any]] = _answer_cases()


class SequenceExploration(RuleMappingEnvironment):
    """Sequence Exploration.

    Args:
        rule1_split: under HARD, score R1 as 5 points (any interleaving) + 15 (the step-parity lead), as the
            official judge text does; ``False``: 20 points all or nothing.
        history_tools: expose ``get_game_info`` and ``get_history`` as tools (not tools in the official harness).
        commit_format: ``answer`` (each rule as an expression, graded on :data:`ANSWER_CASES`) or ``choice``
            (rule ids of :data:`SEQ_RULES`, listed in the commit tool).
        (others: see :class:`~zoo.agents.envs.base.Environment`)
    """

    name: ClassVar[str] = "ultrahorizon/sequence"
    keys: ClassVar[tuple[str, ...]] = STAGES
    key_name: ClassVar[str] = "stage"
    rule_library: ClassVar[dict[str, SeqRule]] = SEQ_RULES
    judge_help: ClassVar[str] = (
        "Describe the mechanism of each of rule_1 ... rule_5, including when and how it applies."
    )
    answer_variables: ClassVar[tuple[str, ...]] = ANSWER_VARIABLES
    answer_help: ClassVar[str] = (
        "Format: a JSON object with one entry per rule, rule_1 ... rule_5. Each entry is a Python expression giving "
        "the string that rule outputs, over cur (the string the previous rule output; empty for rule_1), main and "
        "vice (this input pair) and history (the earlier input pairs of this game as [main, vice] lists, oldest "
        'first). Example: {"rule_1": "main[::-1] + vice", "rule_2": "cur.replace(\'A\', \'B\')", ...}. '
        "A rule counts only when its expression gives the true output for every input."
    )

    def __init__(
        self,
        seed: int = 0,
        difficulty: str = "hard",
        required_steps: int = 50,
        free: bool = False,
        rule1_split: bool = True,
        history_tools: bool = False,
        judge: Any = None,
        commit_format: str = "answer",
    ) -> None:
        super().__init__(seed, difficulty, required_steps, free, judge, commit_format)
        self.rule1_split = rule1_split
        self.hidden_tools = () if history_tools else ("get_game_info", "get_history")
        self.rules = STAGE_RULES[difficulty]
        self.total_steps = 0
        self.history: list[dict[str, Any]] = []
        self._cases: dict[str, list[dict[str, Any]]] = {}

    @property
    def prompt(self) -> str:
        budget = "" if self.free else f" A game takes {self.required_steps} input pairs in total."
        return (
            "SEQUENCE EXPLORATION. You face a hidden system that transforms pairs of letter sequences. Your goal is "
            "to discover the hidden rules it applies to pairs of sequences of the letters A-E.\n"
            "Rules of the game:\n"
            "- Every input is TWO sequences of EXACTLY 5 characters, each using only the letters A-E.\n"
            "- Each sequence must contain at least 2 different letters.\n"
            '- The first sequence is the "main" string and the second the "vice" string.\n'
            f"- Every input pair uses 1 step.{budget}\n"
            "- Each input pair goes through a fixed chain of transformations. Every transformation applies the same "
            "rule every time, working on the current result and/or the original inputs.\n"
            "- The hidden rules stay the same for the whole game; only exploration reveals them.\n"
            "- The game is over when the step limit is reached or when you submit your final answer.\n"
            "Notes:\n"
            "- The rules are deterministic but hidden: test repeatedly to confirm the true rules.\n"
            "- A rule may depend on the content of the sequences, on positions, on the history, or on how main and "
            "vice relate.\n"
            "- Write the transformations you observe and your hypotheses in your notes.\n"
            "- You can commit only once, so wait until you are confident.\n"
            "- The aim is to uncover and describe the mechanisms behind these dual-sequence transformations.\n"
            'Input format: pairs such as ("ABCDE", "DECBA") or ("AABCE", "DDEAC"), each exactly 5 characters with '
            "at least 2 different letters. The output shows the result after each rule, step by step.\n"
            "Difficulty: easy games use simplified versions of rules 1-5, hard games use complex versions.\n"
            "Start experimenting and find the transformation rules."
        )

    # -- tools ------------------------------------------------------------------------------------------------
    @agent_tool
    def input_sequences(self, main_sequence: str, vice_sequence: str) -> dict[str, Any]:
        """Input a main and a vice sequence (5 letters from A-E each) and see every transformation.

        Args:
            main_sequence: 5 letters from A-E with at least 2 different letters.
            vice_sequence: 5 letters from A-E with at least 2 different letters.
        """
        if self.committed:
            return {"error": "Final result already submitted. No more inputs allowed."}
        if self.total_steps >= self.required_steps:
            return {"error": f"Maximum steps ({self.required_steps}) reached. You should commit your final result."}
        for label, sequence in (("Main", main_sequence), ("Vice", vice_sequence)):
            problem = validate_sequence(sequence)
            if problem:
                return {"error": f"{label} sequence error: {problem}"}
        self.total_steps += 1
        last = self.history[-1] if self.history else {}
        outputs = run_chain(
            self.rules,
            main_sequence,
            vice_sequence,
            self.total_steps,
            last.get("main_input", ""),
            last.get("vice_input", ""),
        )
        transformations = [
            {
                "step": 0,
                "rule": "input",
                "sequence": f"main: {main_sequence}, vice: {vice_sequence}",
                "main": main_sequence,
                "vice": vice_sequence,
            }
        ]
        transformations += [{"step": i + 1, "rule": STAGES[i], "sequence": s} for i, s in enumerate(outputs)]
        entry = {
            "main_input": main_sequence,
            "vice_input": vice_sequence,
            "transformations": transformations,
            "final_output": outputs[-1],
            "step_number": self.total_steps,
        }
        self.history.append(entry)
        return {"success": True, **entry, "steps_remaining": self.required_steps - self.total_steps}

    @agent_tool
    def get_game_info(self) -> dict[str, Any]:
        """Input format, steps used and remaining."""
        return {
            "alphabet": list(ALPHABET),
            "sequence_length": 5,
            "min_unique_letters": 2,
            "total_rules": len(self.rules),
            "steps_used": self.total_steps,
            "steps_remaining": self.required_steps - self.total_steps,
            "history_count": len(self.history),
        }

    @agent_tool
    def get_history(self, last_n: int | None = None) -> dict[str, Any]:
        """Earlier inputs and their transformations.

        Args:
            last_n: only the last n entries (all when omitted).
        """
        entries = self.history if last_n is None else (self.history[-last_n:] if last_n > 0 else [])
        return {"history": entries, "total_entries": len(self.history)}

    # -- commit -----------------------------------------------------------------------------------------------
    def commit_refusal(self) -> str | None:
        if self.total_steps < self.required_steps:
            return f"Cannot commit yet: {self.required_steps} inputs are required, {self.total_steps} made so far."
        return None

    def truth(self) -> dict[str, str]:
        return dict(zip(STAGES, self.rules))

    def _split_rule_1(self, key: str) -> bool:
        return key == "rule_1" and self.difficulty != "easy" and self.rule1_split

    def answer_cases(self, key: str) -> list[dict[str, Any]]:
        """:data:`ANSWER_CASES` with ``cur`` = what the true chain gives the rule ``key`` on each input."""
        if key not in self._cases:
            stage = STAGES.index(key)
            cases = []
            for case in ANSWER_CASES:
                last = case["history"][-1] if case["history"] else ["", ""]
                n = len(case["history"]) + 1
                chain = run_chain(self.rules[:stage], case["main"], case["vice"], n, *last)
                cases.append({**case, "cur": chain[-1] if chain else ""})
            self._cases[key] = cases
        return self._cases[key]

    def rule_function(self, rule_id: str) -> Callable[[dict[str, Any]], str]:
        rule = SEQ_RULES[rule_id]

        def apply(case: dict[str, Any]) -> str:
            last = case["history"][-1] if case["history"] else ["", ""]
            n = len(case["history"]) + 1
            return rule.apply(SeqContext(case["cur"], case["main"], case["vice"], n, *last))

        return apply

    def score_key(self, key: str, given: Any, truth: str) -> list[RubricItem]:
        if not self._split_rule_1(key):
            return super().score_key(key, given, truth)
        exact = self.key_correct(key, given, truth)
        if self.commit_format == "choice":
            interleaves = given in INTERLEAVE_FAMILY
        else:
            either = lambda case: {_interleave(case["main"], case["vice"]), _interleave(case["vice"], case["main"])}
            interleaves = exact or all(_safe(given, c) in either(c) for c in self.answer_cases(key))
        comment = given if isinstance(given, str) else "expression"
        return [
            RubricItem("rule_1 interleaving", 5, 5 if interleaves else 0, comment),
            RubricItem("rule_1 step-parity lead", 15, 15 if exact else 0, comment),
        ]

    def rubric(self) -> list[tuple[str, int, str]]:
        items = super().rubric()
        if self._split_rule_1("rule_1"):
            items[0:1] = [
                ("rule_1 interleaving", 5, "states that main and vice are interleaved"),
                ("rule_1 step-parity lead", 15, "states which string leads by the parity of the step number"),
            ]
        return items
