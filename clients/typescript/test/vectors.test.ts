/** The cross-language test vectors (tests/vectors/formats.json, computed by the server's own functions): this SDK's shard of a run id, and its JSON against the server's canonical JSON. */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { parse, stringify, type JsonValue } from "../src/index.js";
import { shardOf } from "../src/route.js";

interface Vectors {
  run_shards: { shards: number; cases: { run_id: string; shard: number }[]; not_run_ids: string[] };
  canonical_json: { cases: { name: string; input: string; canonical: string; sha256: string; plain_integers: boolean }[] };
}

const VECTORS = JSON.parse(readFileSync(new URL("../../../tests/vectors/formats.json", import.meta.url), "utf8")) as Vectors;

/** An object key JavaScript puts before all others, in numeric order, whatever order the text had. */
const ARRAY_INDEX = /^(0|[1-9]\d*)$/;

function hasIndexKey(value: JsonValue): boolean {
  if (value === null || typeof value !== "object") return false;
  if (Array.isArray(value)) return value.some(hasIndexKey);
  return Object.entries(value).some(([key, item]) => ARRAY_INDEX.test(key) || hasIndexKey(item));
}

describe("vectors", () => {
  test("a run's shard is the server's", () => {
    for (const { run_id, shard } of VECTORS.run_shards.cases) {
      assert.equal(shardOf(run_id), shard, run_id);
      assert.ok(shard < VECTORS.run_shards.shards);
    }
    for (const text of VECTORS.run_shards.not_run_ids) assert.equal(shardOf(text), undefined, JSON.stringify(text));
  });

  for (const { name, input, canonical, sha256, plain_integers } of VECTORS.canonical_json.cases) {
    test(`canonical JSON and its digest: ${name}`, () => {
      // The digest approvers see is the SHA-256 of the canonical text.
      assert.equal(createHash("sha256").update(canonical, "utf8").digest("hex"), sha256);
      // Canonicalizing changes no value this SDK reads.
      const value = parse(canonical);
      assert.deepEqual(parse(input), value);
      // What it writes of the value is the canonical text, keys in the server's order, except where
      // JavaScript cannot keep it: numbers with a fraction or exponent are doubles (1.50 is 1.5), and
      // an object puts keys like "2" and "10" first, in numeric order.
      if (plain_integers && !hasIndexKey(value)) assert.equal(stringify(value), canonical);
    });
  }
});
