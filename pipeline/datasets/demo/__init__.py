"""A deterministic demo corpus of agent memories, with a judged query set.

Two namespaces: ``code`` holds an engineering agent's memories (deploy notes,
incidents and their log lines, code review notes, config facts, commands,
decisions); ``messages`` holds a personal assistant's memories of chats
(preferences, people, plans, travel, meetings).

The generator plants the structure the engine is meant to exploit and knows
where it put it, so relevance judgments come from that knowledge, not from
searching the texts:

* supersession chains (a fact, then its replacement, sometimes a third value),
* conflicting pairs (two sources that disagree and neither replaces the other),
* supports (log lines backing an incident's conclusion, a booking confirmation
  backing a plan),
* exact identifiers (error codes, hosts, paths, tickets, versions, booking
  references) that each occur in a handful of memories only.

Everything is drawn from one ``random.Random(seed)``; the same seed gives the
same bytes. Nothing reads the clock.

The package: ``world`` (the generator's state and helpers), ``tables`` (the
sentence tables and specs, read from ``pipeline/datasets/demo_data/*.json``),
``planted`` (chains, conflicts, incidents, supports), ``everyday`` (the other
memories), ``queries`` (identifier and topical questions) and ``corpus`` (the
assembly and the public functions re-exported here).
"""

from pipeline.datasets.demo.corpus import generate_corpus, generate_queries, write_demo

__all__ = ["generate_corpus", "generate_queries", "write_demo"]
