"""The planted structure: supersession chains, conflicting pairs, incidents and supports.

Each builder adds its memories to the ``World`` and the query specs that are
judged from what it planted.
"""

from __future__ import annotations

from datetime import timedelta

from pipeline.datasets.demo import tables as T
from pipeline.datasets.demo.world import END, QuerySpec, World, fill, iso, wday


def build_chain(w: World, spec: T.ChainSpec) -> None:
    k = w.rng.choice((2, 3))
    times = w.times(k, gap_days=9)
    extra = spec.extra(w) if spec.extra else {}
    values = spec.values(w, times, extra)
    ident_slots = ("v", "old") if spec.ident_kind else ()
    keys: list[int] = []
    for i, (when, value) in enumerate(zip(times, values)):
        slots = {**extra, "v": value, "old": values[i - 1] if i else ""}
        template = w.rng.choice(spec.first if i == 0 else spec.update)
        text, idents = fill(template, slots, ident_slots)
        if spec.ident_kind == "flight":
            # The value is "TP1351 on Thursday 12 June"; the identifier is the flight number.
            idents = [v.split(" ", 1)[0] for v in idents]
        keys.append(
            w.add(
                spec.namespace, text, spec.types[0 if i == 0 else 1], when, spec.topics, spec.concepts,
                idents=idents, source=spec.source, supersedes=keys[-1:], grade=2 if i == k - 1 else 1,
            )
        )
    judged = {key: (2 if i == k - 1 else 1) for i, key in enumerate(keys)}
    w.paraphrases.append(QuerySpec(spec.question.format(**extra), spec.namespace, "paraphrase", judged))
    if spec.ident_kind:
        for i, key in enumerate(keys):
            ident = w.drafts[key].idents
            value = values[i].split(" ", 1)[0] if spec.ident_kind == "flight" else values[i]
            assert value in ident
            # Judged best: the newest memory that mentions it (it says where the value stands now).
            mentioning = [kk for kk in keys if value in w.drafts[kk].idents]
            w.ident(value, spec.namespace, spec.ident_kind, mentioning[-1])


def build_conflict(w: World, spec: T.ConflictSpec) -> None:
    extra = spec.extra(w) if spec.extra else {}
    va, vb = w.rng.sample(list(spec.pool), 2)
    ta, tb = w.times(2, gap_days=2)
    a = w.add(
        spec.namespace, w.rng.choice(spec.a).format(v=va, **extra), spec.types[0], ta, spec.topics, spec.concepts,
        source=spec.sources[0], grade=spec.grades[0] if spec.types[0] == "decision" else 1,
    )
    b = w.add(
        spec.namespace, w.rng.choice(spec.b).format(v=vb, **extra), spec.types[1], tb, spec.topics, spec.concepts,
        source=spec.sources[1], conflicts=[a],
    )
    w.topical.append(
        QuerySpec(spec.question.format(**extra), spec.namespace, "topical", {a: spec.grades[0], b: spec.grades[1]})
    )


def build_incident(w: World, spec: T.IncidentSpec) -> None:
    t0 = w.at(hi=END - timedelta(days=20))
    slots = {
        "code": spec.code,
        "host": w.host(*spec.host_role),
        "aux": w.host(*spec.aux_role),
        "path": w.pick((spec.path,)),
        "ticket": w.ticket(),
        "version": w.version(spec.major),
        "pid": str(w.rng.randint(1200, 48000)),
        "hex": "".join(w.rng.choice("0123456789abcdef") for _ in range(5)),
    }
    if spec.aux_role[0] == "registry":
        slots["aux"] = slots["aux"].replace(".internal", ".example.com")
    n_logs = w.rng.choice((1, 2)) if len(spec.logs) > 1 else 1
    logs: list[int] = []
    for i in range(n_logs):
        when = t0 + timedelta(minutes=7 * i, seconds=w.rng.randint(1, 59))
        text, idents = fill(spec.logs[i], {**slots, "ts": iso(when)})
        logs.append(
            w.add("code", text, "log", when, spec.topics, spec.concepts, idents, "loki",
                  extra_meta={"service": spec.service})
        )
    done = t0 + timedelta(days=w.rng.randint(1, 4), hours=w.rng.randint(1, 8))
    text, idents = fill(spec.conclusion, slots)
    conclusion = w.add("code", text, "text", done, spec.topics, spec.concepts, idents, "postmortem",
                       supported_by=logs, grade=2)
    judged = {conclusion: 2, **{k: 1 for k in logs}}
    if w.rng.random() < 0.6:
        text, idents = fill(w.rng.choice(T.FOLLOWUPS), slots)
        later = done + timedelta(days=w.rng.randint(3, 12))
        judged[w.add("code", text, "text", later, spec.topics[:1], spec.concepts[:1], idents, "jira")] = 1
    w.ident(spec.code, "code", "error", conclusion)
    w.ident(slots["ticket"], "code", "ticket", conclusion)
    w.ident(slots["host"], "code", "host", logs[0])
    w.optional_paraphrases.append(QuerySpec(spec.question, "code", "paraphrase", judged))


def build_supports(w: World) -> None:
    for spec in T.SUPPORTS:
        if spec.window:
            event = w.at(*spec.window)
            event -= timedelta(days=event.weekday())  # camps start on a Monday
            t_ev = w.at(hi=event - timedelta(days=21))
        else:
            t_ev = w.at(hi=END - timedelta(days=5))
            event = t_ev + timedelta(days=w.rng.randint(7, 40))
        hotel, city = w.rng.choice(T.HOTELS)
        slots = {
            "date": wday(event),
            "booking": w.booking(),
            "hotel": hotel,
            "city": city,
            "rest": w.rng.choice(T.RESTAURANTS),
        }
        ev_text, ev_idents = fill(spec.evidence, slots)
        ev_key = w.add("messages", ev_text, spec.evidence_type, t_ev, spec.topics, spec.concepts, ev_idents,
                       "chat" if spec.evidence_type == "chat" else "email")
        c_text, c_idents = fill(spec.conclusion, slots)
        t_c = t_ev + timedelta(hours=w.rng.randint(1, 48))
        c_key = w.add("messages", c_text, spec.conclusion_type, t_c, spec.topics, spec.concepts, c_idents,
                      "assistant", supported_by=[ev_key], grade=2)
        for ident in ev_idents:
            w.ident(ident, "messages", "booking", ev_key)
        w.optional_paraphrases.append(
            QuerySpec(spec.question.format(**slots), "messages", "paraphrase", {c_key: 2, ev_key: 1})
        )
