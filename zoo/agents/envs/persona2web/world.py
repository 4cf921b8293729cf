"""PersonaWebSim world: sites with seeded catalogues, a user profile, a year of web history, and level-1/2/3 queries.

Persona2Web (arXiv 2602.17003) builds each user from a profile, derives *event seeds* (recurring patterns), and
spreads dated web actions over a year; every history entry has the fields ``timestamp``, ``type`` (web search, web
visit, purchase, booking, review & rating), ``object`` and ``website``, and preferences show only as behaviour,
never as a statement. This module follows that pipeline offline, with one seeded ``random.Random`` per world:

``profile -> event seeds -> dated actions (+ distractors: gifts, one-off visits, unrelated browsing)``

The three domains mirror the released task domains A/B/C (apparel shopping, event tickets, online courses) with
3-5 fictional sites each (a *substitute* for the live web, not a replica). Every preference is categorical
[reconstruction: the released tasks also use numeric standards such as "4.2+ stars with 50+ reviews"].

Query templates follow the phrasing of the released task files (``personalization_{1,2,3}``): level 1 hides the
site, the preference values and the location ("in my usual ..."), level 2 states the values in bold and hides the
site and location, level 3 states everything ("At <site>, ... (<city> <zip>)").

Equation/rule -> function map:

* profile (demographics + per-domain site, category, attribute values, location) -> :func:`make_profile`
* event seeds and dated actions, distractors -> :func:`make_history`
* preferred site = frequency argmax of the domain's site actions -> :func:`site_counts`
* level templates and the hidden fields of each level -> :func:`make_task`, :data:`HIDDEN_FIELDS`
* history files (JSONL, the four fields) -> :func:`load_history`, :func:`write_history`
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from zoo.errors import ConfigError, DataError

LEVELS = (1, 2, 3)
HISTORY_FIELDS = ("timestamp", "type", "object", "website")
ACTION_TYPES = ("web search", "web visit", "purchase", "booking", "review & rating")
SEARCH_SITE = "findit.com"
NOISE_SITES = ("dailynews.com", "weatherly.com", "recipebox.com", "mapsnow.com", "videotube.com")
NOISE_OBJECTS = (
    "read the article 'City council approves new bike lanes'",
    "checked the 10-day forecast",
    "opened the recipe 'one-pot lentil soup'",
    "looked up driving directions to the airport",
    "watched the video 'how to fix a leaking tap'",
    "read the article 'Local team wins the regional final'",
    "opened the recipe 'sheet-pan chicken'",
)
FIRST_NAMES = ("Alex", "Avery", "Jordan", "Riley", "Morgan", "Casey", "Taylor", "Jamie", "Quinn", "Drew")
LAST_NAMES = ("Garcia", "Lee", "Smith", "Davis", "Nguyen", "Patel", "Kim", "Brown", "Lopez", "Walker")
LOCATIONS = (
    ("Los Angeles, CA", "90210"),
    ("Austin, TX", "73301"),
    ("Chicago, IL", "60601"),
    ("Seattle, WA", "98101"),
    ("Boston, MA", "02108"),
)
YEAR_START = datetime(2025, 1, 1, 8, 0)


@dataclass(frozen=True)
class DomainSpec:
    """One task domain: its code in the released task ids, its candidate sites, categories and attributes.

    Attributes:
        name: domain name (``apparel`` | ``events`` | ``courses``).
        code: the letter of the released task ids (``<First_Last>_{A,B,C}{level}``).
        sites: candidate site names (a world uses 3-5 of them).
        categories: item categories; a persona's task asks for one of them.
        attributes: the preference attributes and their values (the sites' search filters).
        purchase_type: the history action type of an acquisition (``purchase`` or ``booking``).
        templates: the level-1/2/3 query templates (``{category}``, ``{site}``, ``{city}``, ``{zip}``, attributes).
    """

    name: str
    code: str
    sites: tuple[str, ...]
    categories: tuple[str, ...]
    attributes: dict[str, tuple[str, ...]]
    purchase_type: str
    templates: dict[int, str]


DOMAINS: dict[str, DomainSpec] = {
    spec.name: spec
    for spec in (
        DomainSpec(
            "apparel",
            "A",
            ("threadline.com", "urbanfit.com", "closetco.com", "denimdepot.com", "stylemart.com"),
            ("slim-fit chinos", "crew-neck t-shirts", "running sneakers"),
            {"size": ("size S", "size M", "size L", "size XL"), "color": ("navy", "olive", "black", "khaki", "grey")},
            "purchase",
            {
                1: "Find {category} in my usual size and color on the site I usually shop at",
                2: "Find {category} in **{size}** and **{color}**",
                3: "At {site}, find {category} in **{size}** and **{color}** ({city} {zip})",
            },
        ),
        DomainSpec(
            "events",
            "B",
            ("ticketvault.com", "seatsnap.com", "stagepass.com", "gatehouse.com", "showline.com"),
            ("concerts", "music festivals", "club nights"),
            {
                "genre": ("hip-hop/R&B", "jazz", "indie rock", "country", "classical"),
                "seat": ("lower-bowl seats near the stage", "balcony seats", "floor standing", "upper-level seats"),
            },
            "booking",
            {
                1: "Check seat availability for upcoming {category} in my preferred genre with seats in my preferred "
                "location",
                2: "Check seat availability for upcoming {category} in **{genre}** with seats in **{seat}**",
                3: "At {site}, check seat availability for upcoming {category} in **{genre}** with seats in **{seat}** "
                "({city} {zip})",
            },
        ),
        DomainSpec(
            "courses",
            "C",
            ("learnhub.org", "skillpath.io", "campusnow.com", "mooczone.net", "brightcourse.com"),
            ("data science courses", "language courses", "design courses"),
            {
                "difficulty": ("beginner level", "intermediate level", "advanced level"),
                "workload": ("1-2 hours/week", "3-5 hours/week", "6-10 hours/week"),
            },
            "purchase",
            {
                1: "Find online {category} that meet my preferred difficulty and fit my usual weekly workload on my "
                "preferred platform",
                2: "Find online {category} that meet **{difficulty}** difficulty and fit **{workload}** on my "
                "preferred platform",
                3: "At {site}, find online {category} that meet **{difficulty}** difficulty and fit **{workload}** "
                "({city} {zip})",
            },
        ),
    )
}

#: the task fields each level leaves out of the query (``attributes`` stands for every preference attribute)
HIDDEN_FIELDS: dict[int, tuple[str, ...]] = {1: ("site", "attributes", "location"), 2: ("site", "location"), 3: ()}


def domain_spec(name: str) -> DomainSpec:
    if name not in DOMAINS:
        raise ConfigError(f"unknown Persona2Web domain {name!r}; choose one of {sorted(DOMAINS)}")
    return DOMAINS[name]


def site_domain(site: str) -> str | None:
    """The domain a site belongs to (``None`` for the search engine and unrelated sites)."""
    return next((d.name for d in DOMAINS.values() if site in d.sites), None)


def location_text(location: tuple[str, str]) -> str:
    return f"{location[0]} {location[1]}"


# --------------------------------------------------------------------------------------------------- catalogue
@dataclass(frozen=True)
class Item:
    """One catalogue item of a site; ``attributes`` hold one value per attribute of the domain."""

    id: str
    site: str
    category: str
    attributes: dict[str, str]
    location: str
    price: float
    rating: float
    reviews: int
    rank: float

    def title(self) -> str:
        values = ", ".join(self.attributes[k] for k in sorted(self.attributes))
        return f"{self.category} ({values})"

    def page(self) -> str:
        """The rendered item page."""
        lines = [
            f"{self.site} | item {self.id}",
            f"{self.title()}",
            *(f"{name}: {value}" for name, value in sorted(self.attributes.items())),
            f"available in: {self.location}",
            f"price: ${self.price:.2f}",
            f"rating: {self.rating:.1f} stars ({self.reviews} reviews)",
            "[Add to cart] (do not buy: stop before payment)",
        ]
        return "\n".join(lines)


@dataclass
class Site:
    """A simulated website: a catalogue served to one location at a time (the site's default until set)."""

    name: str
    domain: str
    default_location: str
    items: list[Item] = field(default_factory=list)

    def home_page(self, location: str) -> str:
        spec = DOMAINS[self.domain]
        filters = "; ".join(f"{name}: {', '.join(values)}" for name, values in spec.attributes.items())
        return "\n".join(
            [
                f"Welcome to {self.name}",
                f"Showing results for: {location} (change with set_location)",
                f"Categories: {', '.join(spec.categories)}",
                f"Search filters: {filters}",
            ]
        )


def make_sites(rng: random.Random, sites_per_domain: int) -> dict[str, Site]:
    """``sites_per_domain`` sites per domain, each with one item per (category, attribute combination) at a random
    location of its service area (3 of the 5 locations)."""
    if not 3 <= sites_per_domain <= 5:
        raise ConfigError(f"sites_per_domain must be between 3 and 5 (the design), got {sites_per_domain}")
    sites: dict[str, Site] = {}
    for spec in DOMAINS.values():
        names = rng.sample(list(spec.sites), sites_per_domain)
        for name in sorted(names, key=spec.sites.index):
            area = [location_text(loc) for loc in rng.sample(list(LOCATIONS), 3)]
            site = Site(name, spec.name, area[0])
            combos = [{}]
            for attr, values in spec.attributes.items():
                combos = [{**c, attr: v} for c in combos for v in values]
            for category in spec.categories:
                for combo in combos:
                    site.items.append(_item(rng, site, category, combo, rng.choice(area)))
            sites[name] = site
    return sites


def _item(rng: random.Random, site: Site, category: str, attributes: dict[str, str], location: str) -> Item:
    prefix = site.name.split(".")[0][:4].upper()
    return Item(
        id=f"{prefix}-{len(site.items):03d}",
        site=site.name,
        category=category,
        attributes=dict(attributes),
        location=location,
        price=round(rng.uniform(15, 180), 2),
        rating=round(rng.uniform(3.0, 5.0), 1),
        reviews=rng.randint(3, 4000),
        rank=rng.random(),
    )


# ------------------------------------------------------------------------------------------------------ profile
@dataclass(frozen=True)
class DomainPreference:
    """The ground truth of one domain: the preferred site, the recurring category and attribute values."""

    site: str
    category: str
    attributes: dict[str, str]


@dataclass(frozen=True)
class Profile:
    """A synthetic user: name, home location and one preference per domain (never shown to the agent)."""

    name: str
    location: str
    age: int
    preferences: dict[str, DomainPreference]


def make_profile(rng: random.Random, sites: dict[str, Site]) -> Profile:
    location = location_text(rng.choice(LOCATIONS))
    preferences = {}
    for spec in DOMAINS.values():
        domain_sites = [s for s in sites.values() if s.domain == spec.name]
        preferences[spec.name] = DomainPreference(
            site=rng.choice(domain_sites).name,
            category=rng.choice(spec.categories),
            attributes={attr: rng.choice(values) for attr, values in spec.attributes.items()},
        )
    return Profile(f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}", location, rng.randint(21, 68), preferences)


def guarantee_target_items(rng: random.Random, sites: dict[str, Site], profile: Profile) -> None:
    """Every site of a domain offers the persona's target (category, attributes) at the persona's location, so the
    site choice and the preference choice are scored independently."""
    for domain, pref in profile.preferences.items():
        for site in sites.values():
            if site.domain == domain:
                site.items.append(_item(rng, site, pref.category, pref.attributes, profile.location))


# ------------------------------------------------------------------------------------------------------ history
@dataclass(frozen=True)
class HistoryEntry:
    """One dated web action (the four fields of the released memory banks)."""

    timestamp: str
    type: str
    object: str
    website: str

    def text(self) -> str:
        """What retrieval embeds and what ``memory_access`` shows."""
        return f"{self.timestamp} | {self.type} | {self.object} | {self.website}"


@dataclass(frozen=True)
class EventSeed:
    """A recurring pattern (or a distractor) from which dated actions are drawn.

    Attributes:
        domain: the domain (``None`` for unrelated browsing).
        site: where the actions happen.
        category, attributes, location: what the actions are about.
        occurrences: how many times the pattern happens over the year.
        kind: ``recurring`` | ``gift`` | ``one_off`` | ``noise``.
    """

    domain: str | None
    site: str
    category: str
    attributes: dict[str, str]
    location: str
    occurrences: int
    kind: str


def make_event_seeds(rng: random.Random, sites: dict[str, Site], profile: Profile, distractors: int) -> list[EventSeed]:
    """Per domain: two recurring patterns on the preferred site (the target category 4 times a year, and a second
    category with the same attribute values ``max(2, distractors)`` times), plus ``distractors`` gifts (half of them
    of the target category) and one-off visits on other sites, with other values and locations; and a few unrelated
    browsing seeds.

    The preferred site stays the strict frequency argmax of the domain: it gets at least ``2 * (4 + max(2, d))``
    actions, every other site at most ``2 * d``.
    """
    seeds = []
    for domain, pref in profile.preferences.items():
        spec = DOMAINS[domain]
        others = [c for c in spec.categories if c != pref.category]
        second = max(2, distractors)
        seeds.append(EventSeed(domain, pref.site, pref.category, pref.attributes, profile.location, 4, "recurring"))
        seeds.append(
            EventSeed(domain, pref.site, rng.choice(others), pref.attributes, profile.location, second, "recurring")
        )
        other_sites = [s.name for s in sites.values() if s.domain == domain and s.name != pref.site]
        other_locations = [location_text(loc) for loc in LOCATIONS if location_text(loc) != profile.location]
        for _ in range(distractors):
            attributes = {
                a: rng.choice([v for v in vs if v != pref.attributes[a]]) for a, vs in spec.attributes.items()
            }
            kind = rng.choice(("gift", "one_off"))
            category = pref.category if rng.random() < 0.5 else rng.choice(spec.categories)
            seeds.append(
                EventSeed(
                    domain,
                    rng.choice(other_sites),
                    category,
                    attributes,
                    rng.choice(other_locations),
                    1,
                    kind,
                )
            )
    for _ in range(3):
        seeds.append(EventSeed(None, rng.choice(NOISE_SITES), "", {}, profile.location, 2, "noise"))
    return seeds


def _values(attributes: dict[str, str]) -> str:
    return ", ".join(attributes[k] for k in sorted(attributes))


def seed_actions(rng: random.Random, seed: EventSeed) -> list[tuple[str, str, str]]:
    """``(type, object, website)`` actions of one occurrence of a seed (no statement of a preference)."""
    if seed.kind == "noise":
        return [("web visit", rng.choice(NOISE_OBJECTS), seed.site)]
    spec = DOMAINS[seed.domain]
    thing = f"{seed.category} ({_values(seed.attributes)})"
    acquired = (
        f"booked 2 tickets: {thing}, venue in {seed.location}"
        if spec.purchase_type == "booking"
        else f"ordered {thing}, qty 1, delivered to {seed.location}"
    )
    if spec.name == "courses":
        acquired = f"enrolled in {thing}, live sessions scheduled for {seed.location}"
    if seed.kind == "gift":
        return [("web visit", f"viewed {thing}", seed.site), (spec.purchase_type, f"{acquired} (gift)", seed.site)]
    if seed.kind == "one_off":
        return [("web visit", f"viewed {thing} once", seed.site)]
    actions = [
        ("web search", f"query '{seed.category} {_values(seed.attributes)}'", SEARCH_SITE),
        ("web visit", f"viewed {thing}", seed.site),
        (spec.purchase_type, acquired, seed.site),
    ]
    if rng.random() < 0.5:
        actions.append(("review & rating", f"rated {thing} {rng.randint(4, 5)}/5", seed.site))
    return actions


def make_history(rng: random.Random, seeds: list[EventSeed]) -> list[HistoryEntry]:
    """Dated actions over one year, in time order: each occurrence of a seed starts on a random day and its actions
    follow within the hour."""
    dated: list[tuple[datetime, str, str, str]] = []
    for seed in seeds:
        for _ in range(seed.occurrences):
            start = YEAR_START + timedelta(days=rng.randrange(364), minutes=rng.randrange(12 * 60))
            for offset, (kind, obj, site) in enumerate(seed_actions(rng, seed)):
                dated.append((start + timedelta(minutes=7 * offset), kind, obj, site))
    dated.sort(key=lambda row: row[0])
    return [HistoryEntry(t.strftime("%Y-%m-%d %H:%M"), kind, obj, site) for t, kind, obj, site in dated]


def site_counts(history: list[HistoryEntry], domain: str) -> Counter:
    """Actions per site of ``domain`` in a history."""
    return Counter(e.website for e in history if site_domain(e.website) == domain)


# -------------------------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Task:
    """One query of a persona at one level.

    Attributes:
        task_id: ``<First_Last>_<code><level>`` as in the released task files.
        domain, level, query: what the agent is asked.
        category: the requested item category (always stated).
        truth: the answer key: ``site``, ``location`` and every attribute value.
        hidden: the fields the query leaves out (``site``, ``location``, attribute names).
    """

    task_id: str
    domain: str
    level: int
    query: str
    category: str
    truth: dict[str, str]
    hidden: tuple[str, ...]


def make_task(profile: Profile, domain: str, level: int) -> Task:
    if level not in LEVELS:
        raise ConfigError(f"Persona2Web level must be one of {LEVELS}, got {level!r}")
    spec = domain_spec(domain)
    pref = profile.preferences[domain]
    city, zip_code = profile.location.rsplit(" ", 1)
    query = "Query: " + spec.templates[level].format(
        category=pref.category, site=pref.site, city=city, zip=zip_code, **pref.attributes
    )
    hidden = []
    for name in HIDDEN_FIELDS[level]:
        hidden += list(spec.attributes) if name == "attributes" else [name]
    truth = {"site": pref.site, "location": profile.location, **pref.attributes}
    task_id = f"{profile.name.replace(' ', '_')}_{spec.code}{level}"
    return Task(task_id, domain, level, query, pref.category, truth, tuple(hidden))


# ------------------------------------------------------------------------------------------------------- world
@dataclass
class PersonaWorld:
    """Everything one seed generates: sites, profile, event seeds and history."""

    seed: int
    sites: dict[str, Site]
    profile: Profile
    seeds: list[EventSeed]
    history: list[HistoryEntry]

    @classmethod
    def generate(cls, seed: int, sites_per_domain: int = 4, distractors: int = 6) -> PersonaWorld:
        """Build the world of ``seed`` (same seed, same world: one ``random.Random(seed)``, fixed draw order)."""
        if distractors < 0:
            raise ConfigError(f"distractors must be >= 0, got {distractors}")
        rng = random.Random(seed)
        sites = make_sites(rng, sites_per_domain)
        profile = make_profile(rng, sites)
        guarantee_target_items(rng, sites, profile)
        seeds = make_event_seeds(rng, sites, profile, distractors)
        history = make_history(rng, seeds)
        return cls(seed, sites, profile, seeds, history)

    def item(self, item_id: str) -> Item | None:
        return next((i for s in self.sites.values() for i in s.items if i.id == item_id), None)

    def domain_sites(self, domain: str) -> list[str]:
        return [s.name for s in self.sites.values() if s.domain == domain]

    def task(self, domain: str, level: int) -> Task:
        return make_task(self.profile, domain, level)


# ----------------------------------------------------------------------------------------------- history files
def write_history(entries: list[HistoryEntry], path: str | Path) -> Path:
    """One JSON object per line with the four fields."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(e)) + "\n" for e in entries))
    return path


def load_history(path: str | Path) -> list[HistoryEntry]:
    """Read a history JSONL file; a malformed line is a :class:`~zoo.errors.DataError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"history file {path} does not exist")
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data: Any = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(data, dict):
            raise DataError(f"{path}:{number}: expected a JSON object with fields {list(HISTORY_FIELDS)}")
        missing = [f for f in HISTORY_FIELDS if not isinstance(data.get(f), str) or not data[f].strip()]
        if missing:
            raise DataError(
                f"{path}:{number}: history entry lacks field(s) {missing} (each entry needs non-empty strings "
                f"{list(HISTORY_FIELDS)})"
            )
        entries.append(HistoryEntry(*(data[f] for f in HISTORY_FIELDS)))
    return entries
