"""Small judged sets of different character from the demo and LoCoMo, for
choosing defaults that are not tuned to one corpus (issue 16):

* ``entities``: many people, each with a few facts; a question names the
  person and asks for one attribute in other words than the memory uses,
  beside the person's other memories and other people's same-attribute ones.
* ``paraphrase``: a question that shares (almost) no word with its memory:
  every content word of the memory is swapped for a synonym in the question,
  beside distractors that share the question's words but not its meaning.
* ``identifiers``: near-identical log and ticket memories told apart only by
  an identifier (ticket, host, commit, error code); the question quotes it.
* ``long_short``: long memories (a meeting's notes, a dozen facts) beside
  short ones; a question asks for one fact, in a long memory or a short one.

Held out (written after the fusion defaults were chosen on the four above,
the demo set and LoCoMo, and never used to choose them):

* ``typos``: a question with a misspelt key word or two, beside memories
  sharing the question's other words.
* ``howto``: operational notes (commands, settings, where things live); a
  question asks how to do the task in its own words, some naming the tool.

Held out from the RRF tie rule (written before the rule was measured on it):

* ``projects``: status updates on many codenamed projects, short ones of one
  fact beside long ones of several; every project's updates share the same
  words, so the codename and the asked-for fact tell them apart. A question
  names the project and asks for one fact, half in the update's own words.

Each set is drawn from ``random.Random(seed)`` (no clock, no files read): the
same seed gives the same bytes. Judgments come from what the generator
planted, not from searching the texts. Sizes are a few hundred memories, to
embed in about a minute on two cores. ``write_beir`` writes a BEIR folder, so
``dimple eval --beir DIR`` runs a set end to end.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEED = 16

FIRST = ("Priya", "Tomasz", "Amara", "Kenji", "Lucia", "Oskar", "Fatima", "Mateo", "Ingrid", "Dev", "Chiara",
         "Emeka", "Sofia", "Rahul", "Hana", "Bruno", "Leila", "Niko", "Greta", "Omar", "Yara", "Felix", "Mei",
         "Jonas", "Ada", "Tariq", "Elena", "Kofi", "Nadia", "Viktor")
LAST = ("Raman", "Kowalski", "Okafor", "Tanaka", "Ferreira", "Lindqvist", "Haddad", "Alvarez", "Berg", "Mehta",
        "Conti", "Eze", "Novak", "Iyer", "Sato", "Costa", "Farah", "Virtanen", "Weber", "Saleh")

# attribute -> (memory sentence, question, values); the question avoids the memory's verb
ENTITY_FACTS = {
    "city": ("{p} moved to {v} last spring.", "Which town does {p} live in now?",
             ("Lisbon", "Osaka", "Tallinn", "Denver", "Porto", "Krakow", "Nairobi", "Valencia", "Oslo", "Montreal")),
    "pet": ("{p} adopted a {v} from the shelter.", "What animal does {p} keep at home?",
            ("beagle", "tabby cat", "parrot", "greyhound", "rabbit", "tortoise", "ferret", "corgi")),
    "diet": ("{p} stopped eating {v} after a bad reaction.", "What food is {p} allergic to?",
             ("shellfish", "peanuts", "gluten", "dairy", "eggs", "sesame", "soy", "kiwi")),
    "hobby": ("On weekends {p} goes {v}.", "What does {p} do for fun in free time?",
              ("bouldering", "sailing", "birdwatching", "trail running", "pottery classes", "salsa dancing",
               "fly fishing", "woodworking")),
    "role": ("{p} was promoted to {v} in the autumn.", "What is the job title of {p}?",
             ("staff engineer", "product manager", "head of design", "data scientist", "engineering manager",
              "site reliability lead", "security architect")),
    "drink": ("{p} always orders {v} at the cafe.", "How does {p} take a coffee break beverage?",
              ("an oat flat white", "green tea", "a double espresso", "chai", "sparkling water", "a cortado")),
}

# (memory template, question template, slots); each slot is (memory word, question word) pairs
PARAPHRASES = (
    ("I parked the {a} near the {b}.", "Where did I leave my {a}? Somewhere by the {b}?",
     (("car", "automobile"), ("van", "minibus"), ("bike", "bicycle")),
     (("old library", "book archive"), ("train station", "railway terminal"), ("stadium", "sports arena"))),
    ("The {a} keeps failing every {b}.", "Why does the {a} break down each {b}?",
     (("backup job", "nightly snapshot task"), ("staging deploy", "pre-production rollout"),
      ("billing export", "invoice dump")),
     (("Friday evening", "end of the work week"), ("morning", "start of the day"), ("month end", "close of the month"))),
    ("My {a} prefers {b} for dinner.", "What meal does my {a} like in the evening? {b}?",
     (("daughter", "little girl"), ("husband", "spouse"), ("grandmother", "nan")),
     (("noodles", "ramen"), ("fish", "seafood"), ("soup", "broth"))),
    ("We decided to {a} the {b} next quarter.", "Is there a plan to {a} the {b} soon?",
     (("retire", "decommission"), ("rewrite", "rebuild from scratch"), ("migrate", "move off")),
     (("legacy queue", "old message broker"), ("search cluster", "indexing servers"), ("mobile app", "phone client"))),
    ("The doctor said to {a} for {b}.", "What did the physician recommend? {a} for {b}?",
     (("rest the knee", "avoid running"), ("cut caffeine", "skip coffee"), ("stretch daily", "do mobility exercises")),
     (("two weeks", "a fortnight"), ("a month", "four weeks"), ("ten days", "a week and a half"))),
    ("Budget for the {a} is capped at {b}.", "How much money can we spend on the {a}? {b}?",
     (("offsite", "team retreat"), ("new laptops", "replacement notebooks"), ("conference trip", "summit travel")),
     (("five thousand", "5k"), ("two grand", "2000"), ("nine hundred", "900"))),
    ("The {a} is scared of {b}.", "What frightens the {a}? Is it {b}?",
     (("puppy", "young dog"), ("toddler", "small child"), ("kitten", "young cat")),
     (("thunder", "storms"), ("the vacuum cleaner", "the hoover"), ("fireworks", "loud bangs"))),
    ("Renewal of the {a} is due in {b}.", "When must we renew the {a}? {b}?",
     (("passport", "travel document"), ("TLS certificate", "HTTPS cert"), ("car insurance", "vehicle cover")),
     (("March", "spring"), ("December", "the winter holidays"), ("July", "midsummer"))),
)
DISTRACTOR_PARAPHRASE = (
    "A {q} came up in passing, nothing was decided.",
    "Someone asked about the {q} but it was unrelated to us.",
)

IDENT_TEMPLATES = (
    ("ticket", "INC-{n5}", "Incident {x}: checkout latency above SLO for 20 minutes, mitigated by scaling the pool.",
     "what happened in {x}"),
    ("host", "db-{h4}.{region}", "Host {x} was drained for kernel patching and returned to the pool.",
     "{x}"),
    ("commit", "{h7}", "Commit {x} reverts the retry change in the payment client.",
     "what does commit {x} do"),
    ("error", "E{n4}", "Error {x} means the upstream token expired; refresh and retry once.",
     "error {x}"),
    ("order", "ORD-{n6}", "Order {x} was refunded after the courier lost the parcel.",
     "status of order {x}"),
)
REGIONS = ("eu-west", "us-east", "ap-south", "eu-central")

MEETING_FACTS = (
    "{p} will own the {t} rollout.", "The {t} launch slipped to {m}.", "Legal must review the {t} contract.",
    "The {t} budget was cut by a fifth.", "{p} raised a risk about {t} vendor lock-in.",
    "Customers asked for {t} export to spreadsheets.", "The {t} dashboard shows a drop in weekly users.",
    "{p} will write the {t} runbook.", "On-call for {t} moves to the platform team.",
    "Design review of {t} is booked for {m}.", "The {t} pilot has three customers so far.",
    "Support tickets about {t} doubled since {m}.",
)
TOPICS = ("billing", "search", "onboarding", "analytics", "notifications", "payments", "reporting", "sync",
          "checkout", "identity", "storage", "messaging")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October")
LONG_QUESTIONS = {
    0: "Who is responsible for rolling out {t}?", 1: "When is the {t} launch now?",
    2: "Does the {t} contract need a legal check?", 3: "What happened to the {t} budget?",
    4: "Who worried about lock-in for {t}?", 5: "What did customers request for {t}?",
    6: "Are {t} users declining?", 7: "Who is writing the {t} runbook?",
    8: "Which team takes {t} on-call?", 9: "When is the {t} design review?",
    10: "How many customers are in the {t} pilot?", 11: "Did {t} support tickets go up?",
}


# (memory, question); the question's key words are misspelt by ``_typo``
TYPO_FACTS = (
    ("{p} is training for the Berlin marathon in September.", "when is {p} running the marathon"),
    ("{p} is learning Portuguese before the Lisbon transfer.", "which language is {p} studying"),
    ("{p} bought a secondhand cello from a neighbour.", "what instrument did {p} get"),
    ("{p} cannot stand cilantro in any dish.", "does {p} dislike cilantro"),
    ("{p} renovated the kitchen with oak cabinets.", "what did {p} renovate"),
    ("{p} is organising the charity bake sale on Saturday.", "what is {p} organising on Saturday"),
    ("{p} volunteers at the animal shelter on Tuesdays.", "where does {p} volunteer"),
    ("{p} switched the team's tracker from spreadsheets to Jira.", "what tracker does {p}'s team use"),
)
# (task, memory, question in other words, question naming the tool)
HOWTO = (
    ("rotate", "To rotate the production API key run `vault kv rotate secret/api --env prod`, then restart the gateway.",
     "how do I get a fresh key for the live API", "vault rotate api key prod"),
    ("replica", "A read replica is added with `pg_ctl promote` after `pg_basebackup -D /srv/replica` finishes.",
     "how to set up another copy of the database for reads", "pg_basebackup replica"),
    ("flags", "Feature flags live in `config/flags.yaml`; changes go live after the config service reloads.",
     "where do I switch a feature on or off", "flags.yaml"),
    ("certs", "TLS certificates renew through `certbot renew --deploy-hook reload-nginx` from a weekly cron.",
     "how are https certs kept from expiring", "certbot renew"),
    ("logs", "Application logs ship to Loki; query them in Grafana with `{app=\"checkout\"}`.",
     "where can I read what the checkout service printed", "loki grafana logs"),
    ("oncall", "The on-call rota is in PagerDuty under the Platform schedule; swaps need a lead's approval.",
     "who do I ask to trade my night shift", "pagerduty schedule swap"),
    ("deps", "Dependencies are pinned in `requirements.lock`; update them with `pip-compile --upgrade`.",
     "how to bump the python packages we depend on", "pip-compile upgrade"),
    ("backup", "Nightly backups go to the `s3://acme-backups` bucket and are kept for 35 days.",
     "how long do we keep the nightly copies", "s3 acme-backups"),
    ("vpn", "Remote staff connect with WireGuard; new peers are added in `infra/wg/peers.tf`.",
     "how does someone working from home get onto the internal network", "wireguard peers.tf"),
    ("migrate", "Schema migrations run with `alembic upgrade head` in the release job, never by hand.",
     "how do database table changes get applied", "alembic upgrade head"),
)
TEAMS = ("payments", "search", "growth", "mobile", "data", "platform", "identity", "billing")
CODENAMES = ("Falcon", "Juniper", "Basalt", "Meridian", "Quokka", "Tundra", "Saffron", "Halcyon", "Cobalt",
             "Nimbus", "Orchid", "Pylon", "Marlin", "Sequoia", "Vesper", "Zephyr", "Gondola", "Ember")
# fact -> (update sentence, question in other words, question in the update's words, values)
PROJECT_FACTS = {
    "owner": ("{c} is now owned by {v}, who took over the workstream.", "who is in charge of {c}",
              "who owns {c}", None),
    "deadline": ("The {c} launch date moved to {v}.", "when does {c} have to ship", "{c} launch date", "month"),
    "blocker": ("{c} is blocked on {v}.", "what is holding up {c}", "what is {c} blocked on",
                ("the security review", "a vendor contract", "the data migration", "hiring a designer",
                 "legal sign-off", "the new load balancer")),
    "budget": ("{c} got a budget of {v} for the quarter.", "how much money can {c} spend",
               "{c} budget for the quarter", ("$40k", "$120k", "$75k", "$15k", "$200k", "$60k")),
    "decision": ("For {c} the team decided to {v}.", "what was agreed about {c}", "what did the team decide for {c}",
                 ("drop the mobile app", "rewrite the importer in Go", "keep the old API until June",
                  "merge with the billing project", "pause work until the audit", "ship behind a feature flag")),
    "risk": ("The main risk on {c} is {v}.", "what could go wrong with {c}", "main risk on {c}",
             ("losing the only domain expert", "a slipping partner integration", "cost overruns on compute",
              "unclear requirements from sales", "an untested failover path")),
}


@dataclass
class ProbeSet:
    """One judged set: records (ingest form, one namespace), queries (id, text) and graded judgments."""

    name: str
    records: list[dict] = field(default_factory=list)
    queries: list[dict] = field(default_factory=list)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    def memory(self, text: str) -> str:
        mid = f"{self.name[:3]}-{len(self.records) + 1:05d}"
        self.records.append({"id": mid, "namespace": self.name, "content": text, "content_type": "text"})
        return mid

    def ask(self, text: str, relevant: dict[str, int]) -> None:
        qid = f"{self.name[:3]}-q{len(self.queries) + 1:04d}"
        self.queries.append({"id": qid, "text": text})
        self.qrels[qid] = dict(relevant)


def _people(rng: random.Random, n: int) -> list[str]:
    pairs = [f"{f} {last}" for f in FIRST for last in LAST]
    return rng.sample(pairs, n)


def entities(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("entities")
    people = _people(rng, 80)
    facts = []
    for p in people:
        for attr in rng.sample(sorted(ENTITY_FACTS), 4):
            memory, question, values = ENTITY_FACTS[attr]
            facts.append((p, attr, s.memory(memory.format(p=p, v=rng.choice(values)))))
    for p, attr, mid in rng.sample(facts, 150):
        s.ask(ENTITY_FACTS[attr][1].format(p=p), {mid: 1})
    return s


def paraphrase(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("paraphrase")
    planted = []
    for memory, question, slot_a, slot_b in PARAPHRASES:
        for a in slot_a:
            for b in slot_b:
                planted.append((s.memory(memory.format(a=a[0], b=b[0])), question.format(a=a[1], b=b[1]), a, b))
                # distractors: the question's own words in an unrelated memory
                for word in (a[1], b[1]):
                    s.memory(rng.choice(DISTRACTOR_PARAPHRASE).format(q=word))
    for mid, question, _, _ in rng.sample(planted, len(planted)):
        s.ask(question, {mid: 1})
    return s


def _ident(rng: random.Random, shape: str) -> str:
    return shape.format(
        n4=rng.randrange(1000, 10_000), n5=rng.randrange(10_000, 100_000), n6=rng.randrange(100_000, 1_000_000),
        h4=f"{rng.getrandbits(16):04x}", h7=f"{rng.getrandbits(28):07x}", region=rng.choice(REGIONS))


def identifiers(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("identifiers")
    seen: set[str] = set()
    planted = []
    for _kind, shape, memory, question in IDENT_TEMPLATES:
        for _ in range(60):
            x = _ident(rng, shape)
            if x in seen:
                continue
            seen.add(x)
            ids = [s.memory(memory.format(x=x))]
            if rng.random() < 0.3:  # a follow-up naming it again
                ids.append(s.memory(f"Follow-up on {x}: closed, nothing further to do."))
            planted.append((question.format(x=x), ids))
    for question, ids in rng.sample(planted, 150):
        s.ask(question, {ids[0]: 2, **{m: 1 for m in ids[1:]}})
    return s


def long_short(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("long_short")
    people = _people(rng, 30)
    planted = []
    for n, t in enumerate(TOPICS):
        picks = {i: (rng.choice(people), rng.choice(MONTHS)) for i in range(len(MEETING_FACTS))}
        facts = {i: MEETING_FACTS[i].format(p=picks[i][0], t=t, m=picks[i][1]) for i in range(len(MEETING_FACTS))}
        if n % 2 == 0:
            # one long meeting note holding every fact about the topic
            order = rng.sample(range(len(MEETING_FACTS)), len(MEETING_FACTS))
            long_id = s.memory(f"Notes from the weekly sync on {t}. " + " ".join(facts[i] for i in order))
            where = {i: long_id for i in facts}
        else:
            # each fact on its own, a short memory
            where = {i: s.memory(facts[i]) for i in rng.sample(sorted(facts), len(facts))}
        for i in rng.sample(sorted(facts), 8):
            planted.append((LONG_QUESTIONS[i].format(t=t), where[i]))
    for question, mid in rng.sample(planted, len(planted)):
        s.ask(question, {mid: 1})
    return s


def _typo(rng: random.Random, word: str) -> str:
    """``word`` with two neighbouring letters swapped or one dropped (words under 4 letters kept)."""
    if len(word) < 4:
        return word
    i = rng.randrange(1, len(word) - 2)
    if rng.random() < 0.5 and word[i] != word[i + 1]:  # swapping equal letters would change nothing
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    return word[:i] + word[i + 1:]


def typos(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("typos")
    people = _people(rng, 40)
    planted = []
    for p in people:
        for memory, question in rng.sample(TYPO_FACTS, 4):
            planted.append((s.memory(memory.format(p=p)), question.format(p=p)))
    for mid, question in rng.sample(planted, 150):
        words = question.split()
        # misspell the longest word other than the person's name, and another one half of the time
        keys = sorted((i for i, w in enumerate(words) if w[0].islower()), key=lambda i: -len(words[i]))
        for i in keys[: 1 + (rng.random() < 0.5)]:
            words[i] = _typo(rng, words[i])
        s.ask(" ".join(words), {mid: 1})
    return s


def howto(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("howto")
    planted = []
    for team in TEAMS:
        for _task, memory, other_words, tool in HOWTO:
            # each team keeps its own copy of the note, told apart by the team's name
            mid = s.memory(f"[{team}] {memory}")
            planted.append((mid, f"{team}: {other_words}", f"{team} {tool}"))
    for mid, other_words, tool in rng.sample(planted, len(planted)):
        s.ask(other_words if rng.random() < 0.6 else tool, {mid: 1})
    return s


def projects(seed: int = SEED) -> ProbeSet:
    rng = random.Random(seed)
    s = ProbeSet("projects")
    people = _people(rng, 30)
    planted = []
    for c in CODENAMES:
        facts = {}
        for name, (sentence, _other, _own, values) in PROJECT_FACTS.items():
            v = (rng.choice(people) if values is None else rng.choice(MONTHS) if values == "month"
                 else rng.choice(values))
            facts[name] = sentence.format(c=c, v=v)
        names = rng.sample(sorted(facts), len(facts))
        # two facts told in one long weekly update, the rest each in a short one of their own
        long_facts = names[:2]
        long_id = s.memory(f"Weekly update on {c}: " + " ".join(facts[n] for n in long_facts)
                           + f" Nothing else changed on {c} this week.")
        where = {n: long_id for n in long_facts} | {n: s.memory(facts[n]) for n in names[2:]}
        for n in names:
            _, other, own, _ = PROJECT_FACTS[n]
            planted.append(((own if rng.random() < 0.5 else other).format(c=c), where[n]))
    for question, mid in rng.sample(planted, len(planted)):
        s.ask(question, {mid: 1})
    return s


SETS: dict[str, Callable[[int], ProbeSet]] = {
    "entities": entities, "paraphrase": paraphrase, "identifiers": identifiers, "long_short": long_short,
    "typos": typos, "howto": howto, "projects": projects,
}
HELD_OUT = ("typos", "howto", "projects")  # never used to choose a default


def write_beir(probe: ProbeSet, folder: Path) -> Path:
    """``probe`` as a BEIR folder named after the set (``dimple eval --beir``)."""
    out = Path(folder) / probe.name
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": r["id"], "title": "", "text": r["content"]}) + "\n" for r in probe.records),
        encoding="utf-8")
    (out / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q["id"], "text": q["text"]}) + "\n" for q in probe.queries), encoding="utf-8")
    (out / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t{g}\n" for q, docs in probe.qrels.items() for d, g in docs.items()), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="write the probe sets as BEIR folders")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--sets", default=",".join(SETS))
    args = p.parse_args(argv)
    for name in args.sets.split(","):
        probe = SETS[name](args.seed)
        print(f"{write_beir(probe, args.out)}: {len(probe.records)} memories, {len(probe.queries)} queries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
