"""The gold set of bench.write_pipeline: per user, a seeded sequence of remembers about a few
personal attributes, each with the facts a perfect extractor returns, the decision a perfect
model takes on each fact, and the live facts the user should end with.

Each attribute (city, job, pet, diet, hobby, allergy, partner, children, car, drink) holds one
value at a time. A remember is one of:

- new: states an attribute not held yet (sometimes two; some as an agent's third-person note,
  whose text is the fact itself): ADD;
- paraphrase: restates a held value in other words ("User likes green tea" / "The user enjoys
  green tea"): NONE on the fact that holds it;
- noisy: restates a held value with its case, spacing and punctuation garbled: NONE;
- update: the value changed (a move, a new job): UPDATE of that attribute's fact to the
  canonical text of the new value;
- delete: the attribute is gone ("I sold my car"): DELETE of its fact;
- contradict: an opposing claim with no time cue ("I'm not allergic to peanuts"): CONTRADICT,
  both kept for review, and the attribute is not touched again;
- chatter: no fact.

Any but chatter may carry a second, new attribute too. Every text a fact can be stored as (the
facts, and an UPDATE's new content) is in the user's `registry`, mapping its `norm` to the
(attribute, value) it states, so stored facts can be scored against `final`.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field

REMOVED = "(removed)"  # the value a removal fact ("User sold their car") states

CHATTER = ("Thanks, that's all for now.", "Haha, good one.", "Can you summarise what we talked about?", "ok cool",
           "What time is it in Tokyo?", "Never mind, forget I asked.", "Let me think about it and get back to you.",
           "Good morning!", "That's interesting, tell me more.", "Sounds good to me.", "brb", "Hmm, not sure.",
           "Can you help me write an email?", "lol", "Wait, what were we talking about?", "Nice weather today.")
FILLERS = ("Btw, ", "Also, ", "FYI: ", "Oh and ", "Just so you know: ", "Quick note: ")

NAMES = ("Rosa Samir Tove Ugo Vera Wen Ximena Yusuf Zoe Amara Bruno Chloe Diego Esther Felix Gloria Hassan Ivy "
         "Jakub Keiko Liam Maya Noor Priya").split()
CITIES = ("Lisbon Oslo Nairobi Kyoto Lima Porto Tallinn Dakar Hanoi Quito Bergen Seville Krakow Ghent Mombasa "
          "Sapporo Tbilisi Valletta Zagreb Leipzig").split()
JOBS = ("nurse|teacher|software engineer|accountant|chef|architect|pharmacist|electrician|graphic designer|lawyer|"
        "journalist|data analyst|firefighter|dentist|librarian|mechanic").split("|")
PETS = tuple(f"{s} named {n}" for s, n in zip("dog cat parrot rabbit tortoise hamster ferret gecko dog cat".split(),
                                               "Miso Pixel Biscuit Nova Pepper Ziggy Luna Mochi Olive Rusty".split()))
DIETS = ("vegetarian vegan pescatarian keto gluten-free paleo low-carb Mediterranean").split()
HOBBIES = ("pottery climbing salsa chess watercolour sailing archery knitting fencing kayaking calligraphy "
           "beekeeping birdwatching woodworking surfing").split()
ALLERGENS = ("peanuts|shellfish|pollen|penicillin|dairy|eggs|wheat|sesame|cat hair|latex").split("|")
CARS = tuple(f"{c} {m}" for c, m in zip("red blue green silver black white orange grey yellow brown".split(),
                                        "Toyota Volvo Honda Fiat Subaru Tesla Kia Skoda Mazda Renault".split()))
DRINKS = ("green tea|black coffee|espresso|matcha|chai|kombucha|hot chocolate|rooibos tea|iced latte|"
          "sparkling water").split("|")


@dataclass(frozen=True)
class Attribute:
    """Templates for one attribute. Fields: {v} the value held, {w} the other value, {av}/{aw}
    with an article, {nv}/{nw} as a number of children, {species}/{name} of a pet."""

    key: str
    type: str
    values: tuple[str, ...]
    fact: str  # the canonical statement: what a new value is stored as, and an UPDATE's content
    paraphrases: tuple[str, ...]
    say: tuple[str, ...]  # a remember stating it
    say_again: tuple[str, ...]  # a remember restating it
    update: tuple[str, ...] = ()  # facts of a change from {v} to {w}
    say_update: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()  # facts of its removal
    say_delete: tuple[str, ...] = ()
    contradict: tuple[str, str, str] | None = None  # (fact, value stated, remember) opposing {v}


ATTRIBUTES = (
    Attribute("city", "fact", tuple(CITIES), "User lives in {v}",
              ("User's home is in {v}", "User is based in {v}", "User resides in {v}"),
              ("I live in {v}.", "Home for me is {v}."),
              ("As I mentioned, I'm based in {v}.", "My home is in {v}, remember?"),
              update=("User moved to {w}", "User now lives in {w}", "User relocated from {v} to {w}"),
              say_update=("I moved to {w} last month.", "Big news: we relocated from {v} to {w}!"),
              contradict=("User lives in {w}", "{w}", "I live in {w}.")),
    Attribute("job", "fact", tuple(JOBS), "User works as {av}",
              ("User is employed as {av}", "User earns a living as {av}", "User's profession is {v}"),
              ("I work as {av}.", "I'm {av} by trade."),
              ("Like I said, I'm employed as {av}.", "My profession? I'm {av}."),
              update=("User started a new job as {aw}", "User now works as {aw}",
                      "User changed careers from {v} to {w}"),
              say_update=("I started a new job as {aw} this week!", "I switched careers: no longer {av}, now {aw}."),
              delete=("User quit their job as {av}", "User left their job as {av}"),
              say_delete=("I quit my job as {av} yesterday.", "I handed in my notice; I'm done being {av}."),
              contradict=("User works as {aw}", "{w}", "I'm {aw}.")),
    Attribute("pet", "fact", PETS, "User has a {v}",
              ("User owns a {species} called {name}", "User's {species} is named {name}",
               "User's pet {species} is called {name}"),
              ("I have a {species} called {name}.", "Meet {name}, my {species}!"),
              ("{name} is my {species}, by the way.", "My {species} {name} says hi."),
              delete=("User's {species} {name} passed away", "User rehomed their {species} {name}"),
              say_delete=("Sad news: {name}, my {species}, passed away.", "We had to rehome {name}."),
              contradict=("User has no pets", "none", "I don't have any pets.")),
    Attribute("diet", "preference", tuple(DIETS), "User follows a {v} diet",
              ("User eats a {v} diet", "User keeps to a {v} diet", "User sticks to a {v} diet"),
              ("I'm on a {v} diet.", "I follow a {v} diet."),
              ("Reminder that I eat {v}.", "Still sticking to my {v} diet."),
              update=("User switched to a {w} diet", "User now follows a {w} diet"),
              say_update=("I switched from {v} to {w} recently.", "I've gone {w} now."),
              delete=("User gave up their {v} diet", "User stopped following a {v} diet"),
              say_delete=("I gave up on the {v} diet.", "No more {v} diet for me."),
              contradict=("User does not follow a {v} diet", "not:{v}", "I don't follow a {v} diet.")),
    Attribute("hobby", "preference", tuple(HOBBIES), "User's favourite hobby is {v}",
              ("User loves {v} more than any other hobby", "User's main pastime is {v}", "User's top hobby is {v}"),
              ("My favourite hobby is {v}.", "Nothing beats {v} for me."),
              ("Did I mention I love {v} most of all?", "{v} is still my favourite thing to do."),
              update=("User's favourite hobby is now {w}", "User has taken up {w} as their main hobby"),
              say_update=("These days {w} is my favourite hobby.", "I've swapped {v} for {w}."),
              delete=("User gave up {v}", "User no longer does {v}"),
              say_delete=("I gave up {v}.", "I stopped doing {v} altogether."),
              contradict=("User dislikes {v}", "dislikes:{v}", "I really don't like {v}.")),
    Attribute("allergy", "fact", tuple(ALLERGENS), "User is allergic to {v}",
              ("User has an allergy to {v}", "User has a {v} allergy", "User reacts badly to {v} due to an allergy"),
              ("I'm allergic to {v}.", "I have a {v} allergy."),
              ("Careful, I have an allergy to {v}.", "Remember my {v} allergy."),
              delete=("User is no longer allergic to {v}", "User outgrew their {v} allergy"),
              say_delete=("Good news: I'm no longer allergic to {v}!", "My doctor says I outgrew the {v} allergy."),
              contradict=("User is not allergic to {v}", "not:{v}", "I'm not allergic to {v}.")),
    Attribute("partner", "relationship", tuple(NAMES), "User's partner is {v}",
              ("User is in a relationship with {v}", "User is dating {v}", "{v} is User's partner"),
              ("My partner is {v}.", "I'm with {v}."),
              ("{v} and I are together, as you know.", "My partner {v} says hello."),
              update=("User's new partner is {w}", "User is now in a relationship with {w}"),
              say_update=("I'm seeing someone new: {w}.", "{w} is my partner now."),
              delete=("User broke up with {v}", "User and {v} split up"),
              say_delete=("{v} and I broke up.", "I split up with {v} last week."),
              contradict=("User is single", "single", "I'm single.")),
    Attribute("children", "fact", ("1", "2", "3"), "User has {nv}",
              ("User is a parent of {nv}", "User is the parent of {nv}"),
              ("I have {nv}.", "I'm a parent of {nv}."),
              ("Being a parent of {nv} keeps me busy.", "With {nv} at home, I'm always busy."),
              update=("User now has {nw}", "User had another baby and now has {nw}"),
              say_update=("We just had another baby, so now I have {nw}!", "Baby number {w} arrived!"),
              contradict=("User has {nw}", "{w}", "I have {nw}.")),
    Attribute("car", "fact", CARS, "User drives {av}",
              ("User owns {av}", "User's car is {av}", "User gets around in {av}"),
              ("I drive {av}.", "My car is {av}."),
              ("I took my {v} to work again.", "The {v} I drive needs a wash."),
              update=("User bought {aw} to replace their {v}", "User now drives {aw}"),
              say_update=("I traded in my {v} for {aw}!", "Just bought {aw}; the old car is gone."),
              delete=("User sold their car", "User sold their {v}"),
              say_delete=("I sold my car.", "Sold the {v} this weekend."),
              contradict=("User does not own a car", "none", "I don't own a car.")),
    Attribute("drink", "preference", tuple(DRINKS), "User likes {v}",
              ("The user enjoys {v}", "User is fond of {v}", "User loves drinking {v}"),
              ("I like {v}.", "My go-to drink is {v}."),
              ("Could really go for some {v} right now.", "Nothing like {v} in the morning."),
              update=("User now prefers {w} over {v}", "User switched from {v} to {w}"),
              say_update=("I've switched from {v} to {w}.", "These days I prefer {w} to {v}."),
              delete=("User stopped drinking {v}", "User cut {v} out entirely"),
              say_delete=("I've stopped drinking {v}.", "No more {v} for me."),
              contradict=("User dislikes {v}", "dislikes:{v}", "I can't stand {v}.")),
)
BY_KEY = {a.key: a for a in ATTRIBUTES}

# How often each kind of remember is drawn once the first three (new facts) are made; a kind
# with nothing to act on (no held attribute to update, say) is not drawn.
WEIGHTS = {"new": 0.22, "paraphrase": 0.15, "noisy": 0.12, "update": 0.18, "delete": 0.08, "contradict": 0.05,
           "chatter": 0.12}
SECOND_FACT = 0.25  # a remember (not chatter) also states a new attribute
SECOND_NEW = 0.4  # ...and a new one, another
CONFIDENCE = 0.9  # the perfect extractor's; some facts get 0.8-0.95


def norm(text: str) -> str:
    """Lower case alphanumeric words: a fact and its garbled restatements map alike."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


@dataclass(frozen=True)
class GoldFact:
    content: str
    type: str
    confidence: float
    action: str  # what a perfect model decides: ADD, NONE, UPDATE, DELETE or CONTRADICT
    key: str  # the attribute it concerns
    value: str  # the value it states (REMOVED for a removal)
    target_value: str | None = None  # the held value the decision acts on (not for an ADD)
    new_content: str | None = None  # an UPDATE's new text for the target

    def extraction(self) -> dict:
        return {"content": self.content, "type": self.type, "confidence": self.confidence}


@dataclass(frozen=True)
class Item:
    """One remember: its raw text and the facts a perfect extractor returns from it."""

    user: str
    index: int
    kind: str  # new, paraphrase, noisy, update, delete, contradict, chatter (+new with a second fact)
    text: str
    facts: tuple[GoldFact, ...]


@dataclass
class UserGold:
    user: str
    items: list[Item] = field(default_factory=list)
    final: dict[str, set[str]] = field(default_factory=dict)  # attribute -> values live at the end
    registry: dict[str, tuple[str, str]] = field(default_factory=dict)  # norm(text) -> (attribute, value)

    def lookup(self, text: str) -> tuple[str, str] | None:
        return self.registry.get(norm(text))


def generate(users: int, remembers: int, seed: int, note_share: float, prefix: str = "wp-") -> list[UserGold]:
    """The gold set: `users` users (user_id <prefix>000...) of `remembers` remembers each, the
    same for the same arguments. `note_share`: the share of single-fact new remembers written as
    an agent's note (the raw text is the fact itself)."""
    return [_User(f"{prefix}{u:03d}", random.Random(seed * 100_003 + u), note_share).run(remembers)
            for u in range(users)]


class _User:
    def __init__(self, user: str, rng: random.Random, note_share: float) -> None:
        self.gold = UserGold(user)
        self.rng = rng
        self.note_share = note_share
        self.held: dict[str, str] = {}  # attribute -> value held
        self.closed: dict[str, str] = {}  # contradicted attribute -> the opposing value (both stay)
        self.said: set[str] = set()  # the remembers' texts, as the service's duplicate check sees them
        self.chatter = list(CHATTER)
        rng.shuffle(self.chatter)

    def run(self, remembers: int) -> UserGold:
        for index in range(remembers):
            kinds = {k: w for k, w in WEIGHTS.items() if self._possible(k)}
            kind = "new" if index < 3 and self._possible("new") else self.rng.choices(list(kinds),
                                                                                     list(kinds.values()))[0]
            if kind == "chatter":
                self._add_item(index, kind, [self.chatter.pop() if self.chatter else f"ok {index}"], [])
                continue
            parts = [getattr(self, "_" + kind)()]
            text, fact = parts[0]
            note = text == fact.content  # an agent's note stays the fact alone
            if (not note and self.rng.random() < (SECOND_NEW if kind == "new" else SECOND_FACT)
                    and self._possible("new", but=fact.key)):
                parts.append(self._new(but=fact.key, note=False))
                kind += "+new"
            self._add_item(index, kind, [p[0] for p in parts], [p[1] for p in parts])
        self.gold.final = {k: {v} for k, v in self.held.items()}
        for key, value in self.closed.items():
            self.gold.final.setdefault(key, set()).add(value)
        return self.gold

    # -- what can happen next --------------------------------------------------------------------

    def _open(self, need: str = "") -> list[str]:
        return [k for k in self.held if k not in self.closed and (not need or getattr(BY_KEY[k], need))]

    def _possible(self, kind: str, but: str = "") -> bool:
        if kind == "new":
            return any(a.key not in self.held and a.key not in self.closed and a.key != but for a in ATTRIBUTES)
        if kind in ("paraphrase", "noisy"):
            return bool(self._open())
        if kind == "contradict":
            return not self.closed and bool(self._open("contradict"))
        if kind in ("update", "delete"):
            return bool(self._open(kind))
        return kind == "chatter"

    # -- the kinds of remember: each returns (raw text, fact) and moves the state --------------

    def _new(self, but: str = "", note: bool | None = None) -> tuple[str, GoldFact]:
        attr = self.rng.choice([a for a in ATTRIBUTES if a.key not in self.held and a.key not in self.closed
                                and a.key != but])
        value = self.rng.choice(attr.values)
        self.held[attr.key] = value
        content = _fill(attr.fact, value)
        note = self.rng.random() < self.note_share if note is None else note
        text = content if note else _fill(self.rng.choice(attr.say), value)
        return text, self._fact(attr, content, "ADD", value)

    def _paraphrase(self) -> tuple[str, GoldFact]:
        attr, value = self._pick_held()
        content = _fill(self.rng.choice(attr.paraphrases), value)
        return _fill(self.rng.choice(attr.say_again), value), self._fact(attr, content, "NONE", value, value)

    def _noisy(self) -> tuple[str, GoldFact]:
        attr, value = self._pick_held()
        content = garble(_fill(attr.fact, value), self.rng)
        text = garble(_fill(self.rng.choice(attr.say + attr.say_again), value), self.rng)
        return text, self._fact(attr, content, "NONE", value, value)

    def _update(self) -> tuple[str, GoldFact]:
        attr, old = self._pick_held("update")
        new = str(int(old) + 1) if attr.key == "children" else self.rng.choice([v for v in attr.values if v != old])
        self.held[attr.key] = new
        content = _fill(self.rng.choice(attr.update), old, new)
        fact = self._fact(attr, content, "UPDATE", new, old, new_content=_fill(attr.fact, new))
        return _fill(self.rng.choice(attr.say_update), old, new), fact

    def _delete(self) -> tuple[str, GoldFact]:
        attr, old = self._pick_held("delete")
        del self.held[attr.key]
        content = _fill(self.rng.choice(attr.delete), old)
        return _fill(self.rng.choice(attr.say_delete), old), self._fact(attr, content, "DELETE", REMOVED, old)

    def _contradict(self) -> tuple[str, GoldFact]:
        attr, old = self._pick_held("contradict")
        other = self.rng.choice([v for v in attr.values if v != old])
        fact_t, value_t, say_t = attr.contradict
        value = value_t.format(v=old, w=other)
        self.closed[attr.key] = value
        return _fill(say_t, old, other), self._fact(attr, _fill(fact_t, old, other), "CONTRADICT", value, old)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _pick_held(self, need: str = "") -> tuple[Attribute, str]:
        key = self.rng.choice(self._open(need))
        return BY_KEY[key], self.held[key]

    def _fact(self, attr: Attribute, content: str, action: str, value: str, target_value: str | None = None,
              new_content: str | None = None) -> GoldFact:
        confidence = CONFIDENCE if self.rng.random() < 0.7 else round(self.rng.uniform(0.8, 0.95), 2)
        fact_type = "event" if action in ("UPDATE", "DELETE") else attr.type
        self._register(content, attr.key, value)
        if new_content:
            self._register(new_content, attr.key, value)
        return GoldFact(content, fact_type, confidence, action, attr.key, value, target_value, new_content)

    def _register(self, text: str, key: str, value: str) -> None:
        known = self.gold.registry.setdefault(norm(text), (key, value))
        if known != (key, value):
            raise AssertionError(f"{text!r} would state both {known} and {(key, value)}")

    def _add_item(self, index: int, kind: str, texts: list[str], facts: list[GoldFact]) -> None:
        text = " ".join(texts)
        while _dedup_key(text) in self.said:  # the service would answer a repeat as a duplicate
            text = self.rng.choice(FILLERS) + text
        self.said.add(_dedup_key(text))
        self.gold.items.append(Item(self.gold.user, index, kind, text, tuple(facts)))


def _dedup_key(text: str) -> str:
    """As engram.domain.text.normalize compares remembers: case and runs of white space folded."""
    return " ".join(text.split()).lower()


def _fill(template: str, v: str, w: str | None = None) -> str:
    fields = {"v": v, "av": _article(v), "nv": _children(v)}
    if w is not None:
        fields |= {"w": w, "aw": _article(w), "nw": _children(w)}
    if " named " in v:
        fields["species"], fields["name"] = v.split(" named ", 1)
    text = template.format(**fields)
    return text[0].upper() + text[1:]


def _article(value: str) -> str:
    return ("an " if value[0].lower() in "aeiou" else "a ") + value


def _children(value: str) -> str:
    return f"{value} child" if value == "1" else f"{value} children"


def garble(text: str, rng: random.Random) -> str:
    """`text` with some words' case changed, runs of spaces and stray punctuation: the same
    claim, a different string (not even equal once case and spaces are folded)."""
    while True:
        words = [w.upper() if (r := rng.random()) < 0.2 else w.lower() if r < 0.45 else w for w in text.split()]
        out = words[0]
        for word in words[1:]:
            out += rng.choice([" ", " ", " ", "  ", "   "]) + word
        out = rng.choice(["", " ", "  "]) + out + rng.choice(["!", "!!", " .", "...", "?!", ",", " ;)"])
        if out.strip() != text:
            return out


def add_everything(gold: list[UserGold], fold_identical: bool) -> dict[str, list[tuple[str, str]]]:
    """What a store without reconciliation holds: every extracted fact, as (attribute, value)
    per user; with `fold_identical`, facts whose text is the same once case and spaces are
    folded (the service's content hash) are held once."""
    live: dict[str, list[tuple[str, str]]] = {}
    for user in gold:
        seen: set[str] = set()
        rows = live.setdefault(user.user, [])
        for item in user.items:
            for fact in item.facts:
                if fold_identical:
                    if _dedup_key(fact.content) in seen:
                        continue
                    seen.add(_dedup_key(fact.content))
                rows.append((fact.key, fact.value))
    return live


def summary(gold: list[UserGold]) -> dict[str, Counter]:
    """Counts of the gold set: remembers by kind, facts by expected action."""
    kinds: Counter = Counter()
    actions: Counter = Counter()
    for user in gold:
        for item in user.items:
            kinds[item.kind] += 1
            actions.update(f.action for f in item.facts)
    return {"kinds": kinds, "actions": actions}
