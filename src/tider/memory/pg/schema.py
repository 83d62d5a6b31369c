"""The database schema, created and versioned by ordered migration steps.

``tider_schema`` records the steps applied (version, what it did, when). Opening a store
applies the missing steps, each in its own transaction, under an advisory lock, so two
processes starting at once migrate once; a database migrated by a newer tider is refused
rather than misread. A schema change is a new step appended to ``MIGRATIONS``, never an
edit of an applied one.

Tables (one row per memory / message / posting / term / timeline cluster):

- ``tider_memories``: name, granularity, the ``RetrievalConfig`` it was built with, the
  embedding dimension, corpus statistics (messages, summed BM25 document lengths),
  ``version``, bumped by every add that adds and every delete or update that changes
  something (readers cache per version), and ``rewritten``, the version of the last
  delete or update (a reader's copy older than it cannot be extended by the rows added
  since: it is read again, ``tider.memory.pg.views``);
- ``tider_messages``: the message, its vector (pgvector), ``seq`` (insertion order, a
  bigserial) and ``pos``, its stored position in (timestamp, seq) order: increasing, but
  sparse once a delete left gaps; a window is a ``ts`` range on the ``(memory_id, ts,
  seq)`` index;
- ``tider_gaps``: the stored positions no message holds (left by deletes; the memory row's
  ``gaps`` counts them). A message's position as the API reports it (``Message.id``, the
  embedded store's) is its stored one less the gaps below it (``tider.memory.pg.gaps``), so
  a delete writes what it deletes and never renumbers the rows after it;
- ``tider_postings`` / ``tider_terms``: the BM25 inverted index (term frequency, document
  length and the message's position per posting, document frequency per term);
- ``tider_timeline``: the event clusters (first position and centroid of each);
- ``tider_chunks``: the extra chunk vectors of messages longer than the embedder's window
  (``tider.retrieval.embed``), by the message's ``seq``;
- ``tider_sum_float4``: an aggregate adding float32 in order, for BM25 sums.

An HNSW index is created per memory when it grows past ``hnsw_min_messages``: a partial
expression index ``tider_hnsw_<memory id>`` over the vectors cast to ``halfvec``
(``tider.memory.pg.write``; step 2 dropped step 1's float32 ones). Until an add rebuilds a
dropped one, that memory is searched on the exact path.
"""

from __future__ import annotations

from tider.memory.files import StoreError

LOCK_KEY = 0x74696465725F73  # pg_advisory_lock key for migrations ("tider_s")

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "memories, messages with vectors and positions, BM25 postings and term statistics, timelines",
        [
            "CREATE EXTENSION IF NOT EXISTS vector",
            """CREATE TABLE tider_memories (
                id bigserial PRIMARY KEY,
                name text NOT NULL UNIQUE,
                granularity text NOT NULL,
                config jsonb NOT NULL,
                embedding jsonb NOT NULL DEFAULT '{}',
                dim integer,
                n_messages bigint NOT NULL DEFAULT 0,
                total_length bigint NOT NULL DEFAULT 0,
                max_ts timestamp,
                version bigint NOT NULL DEFAULT 0,
                created_at timestamptz NOT NULL DEFAULT now())""",
            """CREATE TABLE tider_messages (
                memory_id bigint NOT NULL REFERENCES tider_memories (id) ON DELETE CASCADE,
                seq bigserial NOT NULL,
                pos bigint NOT NULL,
                key text NOT NULL,
                ts timestamp NOT NULL,
                text text NOT NULL,
                speaker text NOT NULL,
                session text NOT NULL,
                channel text,
                topic text,
                phase text,
                role text,
                stage integer,
                doc_length integer NOT NULL,
                embedding vector NOT NULL,
                PRIMARY KEY (memory_id, seq),
                UNIQUE (memory_id, key))""",
            "CREATE INDEX tider_messages_time ON tider_messages (memory_id, ts, seq) INCLUDE (pos)",
            "CREATE INDEX tider_messages_pos ON tider_messages (memory_id, pos)",
            """CREATE TABLE tider_postings (
                memory_id bigint NOT NULL REFERENCES tider_memories (id) ON DELETE CASCADE,
                term text NOT NULL,
                seq bigint NOT NULL,
                pos bigint NOT NULL,
                ts timestamp NOT NULL,
                tf integer NOT NULL,
                doc_length integer NOT NULL,
                PRIMARY KEY (memory_id, term, seq) INCLUDE (pos, ts, tf, doc_length))""",
            # a frequent term's postings by shape, then position (tider.memory.pg.lexical._fill)
            "CREATE INDEX tider_postings_shape ON tider_postings (memory_id, term, tf, doc_length, pos)",
            """CREATE TABLE tider_terms (
                memory_id bigint NOT NULL REFERENCES tider_memories (id) ON DELETE CASCADE,
                term text NOT NULL,
                df bigint NOT NULL,
                PRIMARY KEY (memory_id, term))""",
            """CREATE TABLE tider_timeline (
                memory_id bigint NOT NULL REFERENCES tider_memories (id) ON DELETE CASCADE,
                start_pos bigint NOT NULL,
                centroid vector NOT NULL,
                PRIMARY KEY (memory_id, start_pos))""",
            # float32 addition in the order given: BM25 sums as bm25s does (tider.memory.pg.lexical)
            "CREATE AGGREGATE tider_sum_float4 (real) (SFUNC = float4pl, STYPE = real, INITCOND = '0')",
        ],
    ),
    (
        2,
        "HNSW indexes over half-precision vectors: the float32 ones are dropped, the next add rebuilds each",
        [
            r"""DO $$ DECLARE r record; BEGIN
                 FOR r IN SELECT indexname FROM pg_indexes
                          WHERE tablename = 'tider_messages' AND indexname LIKE 'tider\_hnsw\_%' LOOP
                   EXECUTE format('DROP INDEX %I', r.indexname);
                 END LOOP;
               END $$""",
        ],
    ),
    (
        3,
        "chunk vectors of messages longer than the embedder's window (a memory built before has none: reindex it)",
        [
            """CREATE TABLE tider_chunks (
                memory_id bigint NOT NULL,
                seq bigint NOT NULL,
                chunk integer NOT NULL,
                embedding vector NOT NULL,
                PRIMARY KEY (memory_id, seq, chunk),
                FOREIGN KEY (memory_id, seq) REFERENCES tider_messages (memory_id, seq) ON DELETE CASCADE)""",
        ],
    ),
    (
        4,
        "the version of each memory's last delete or update: a reader's copy from before it is read again",
        ["ALTER TABLE tider_memories ADD COLUMN rewritten bigint NOT NULL DEFAULT 0"],
    ),
    (
        5,
        "each message's own metadata (the user's fields), indexed for filters (jsonb containment)",
        [
            "ALTER TABLE tider_messages ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'",
            "CREATE INDEX tider_messages_metadata ON tider_messages USING gin (metadata jsonb_path_ops)",
            "CREATE INDEX tider_messages_session ON tider_messages (memory_id, session)",
        ],
    ),
    (
        6,
        "sparse positions: a delete leaves its positions as gaps (tider_gaps) instead of renumbering the later rows",
        [
            """CREATE TABLE tider_gaps (
                memory_id bigint NOT NULL REFERENCES tider_memories (id) ON DELETE CASCADE,
                pos bigint NOT NULL,
                PRIMARY KEY (memory_id, pos))""",
            "ALTER TABLE tider_memories ADD COLUMN gaps bigint NOT NULL DEFAULT 0",
        ],
    ),
]
LATEST = MIGRATIONS[-1][0]


def applied_version(conn) -> int:
    if conn.execute("SELECT to_regclass('tider_schema')").fetchone()[0] is None:
        return 0
    return conn.execute("SELECT coalesce(max(version), 0) FROM tider_schema").fetchone()[0]


def migrate(conn) -> int:
    """Bring the database to ``LATEST`` (autocommit connection); returns the version."""
    if applied_version(conn) == LATEST:
        return LATEST
    conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tider_schema (version integer PRIMARY KEY, description text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = applied_version(conn)
        if current > LATEST:
            raise StoreError(
                f"the database's tider schema is at version {current}, this tider knows up to {LATEST}: upgrade tider"
            )
        for version, description, statements in MIGRATIONS:
            if version > current:
                with conn.transaction():
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO tider_schema (version, description) VALUES (%s, %s)", (version, description)
                    )
        return LATEST
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
