/**
 * Exact JSON: parse and stringify JSON text without losing integer digits.
 *
 * aaa carries tool arguments, tool outputs and event data as JSON text
 * (`*_json` fields) so that numbers round-trip exactly. `JSON.parse` turns
 * every number into a double, so `9007199254740993` (2^53 + 1) would come back
 * as `9007199254740992`. This module's {@link parse} keeps every integer that
 * fits a double exactly as a `number` and every larger one as a `bigint`;
 * {@link stringify} writes `bigint`s back as plain digits.
 *
 * Numbers with a fraction or an exponent (`1.5`, `2.0`, `1e3`) are parsed as
 * `number`s, as `JSON.parse` does: JavaScript has one number type, so `2.0`
 * reads as `2` and is written back as `2`.
 *
 * @module
 */

/** A JSON value as this SDK represents it: integers beyond 2^53 are `bigint`s. */
export type JsonValue = null | boolean | number | bigint | string | JsonValue[] | JsonObject;

/** A JSON object. */
export interface JsonObject {
  [key: string]: JsonValue;
}

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
const WHITESPACE = /[ \t\n\r]*/y;

/**
 * Parses JSON text exactly: integers outside ±(2^53 - 1) become `bigint`s,
 * every other number a `number`. Throws `SyntaxError` on malformed input.
 */
export function parse(text: string): JsonValue {
  const parser = new Parser(text);
  parser.skipWhitespace();
  const value = parser.value(0);
  parser.skipWhitespace();
  if (parser.pos !== text.length) parser.fail("unexpected trailing characters");
  return value;
}

/** Parses JSON text that must hold an object (as event data and tool arguments do). */
export function parseObject(text: string): JsonObject {
  const value = parse(text);
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new SyntaxError(`expected a JSON object, got ${text.slice(0, 40)}`);
  }
  return value;
}

/**
 * Writes a value as compact JSON text (no spaces, keys in insertion order).
 * `bigint`s are written as integers; `toJSON()` is honoured (so `Date`s become
 * strings); object properties that are `undefined` or functions are left out,
 * and in arrays they become `null`, as with `JSON.stringify`. Throws
 * `TypeError` for `NaN`, `Infinity`, a top-level `undefined` and cycles, which
 * JSON cannot carry.
 */
export function stringify(value: unknown): string {
  const out = write(value, new Set());
  if (out === undefined) throw new TypeError("cannot write undefined as JSON");
  return out;
}

const MAX_DEPTH = 512;

class Parser {
  pos = 0;

  constructor(private readonly text: string) {}

  fail(what: string): never {
    throw new SyntaxError(`invalid JSON at position ${this.pos}: ${what}`);
  }

  skipWhitespace(): void {
    WHITESPACE.lastIndex = this.pos;
    WHITESPACE.exec(this.text);
    this.pos = WHITESPACE.lastIndex;
  }

  value(depth: number): JsonValue {
    if (depth > MAX_DEPTH) this.fail("nested too deeply");
    const c = this.text[this.pos];
    switch (c) {
      case "{":
        return this.object(depth);
      case "[":
        return this.array(depth);
      case '"':
        return this.string();
      case "t":
        return this.literal("true", true);
      case "f":
        return this.literal("false", false);
      case "n":
        return this.literal("null", null);
      default:
        if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) return this.number();
        return this.fail(c === undefined ? "unexpected end" : `unexpected ${JSON.stringify(c)}`);
    }
  }

  literal<T>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.pos)) this.fail(`expected ${word}`);
    this.pos += word.length;
    return value;
  }

  number(): number | bigint {
    NUMBER.lastIndex = this.pos;
    const match = NUMBER.exec(this.text);
    if (match === null) return this.fail("malformed number");
    this.pos = NUMBER.lastIndex;
    const token = match[0];
    const n = Number(token);
    if (match[1] === undefined && match[2] === undefined && !Number.isSafeInteger(n)) {
      return BigInt(token);
    }
    return n;
  }

  string(): string {
    const start = this.pos;
    let i = start + 1;
    for (;;) {
      const c = this.text.charCodeAt(i);
      if (Number.isNaN(c)) {
        this.pos = i;
        this.fail("unterminated string");
      }
      if (c === 0x22) break; // closing quote
      i += c === 0x5c ? 2 : 1; // a backslash escapes the next character
    }
    this.pos = i + 1;
    try {
      return JSON.parse(this.text.slice(start, i + 1)) as string; // decodes escapes, rejects control characters
    } catch {
      this.pos = start;
      return this.fail("malformed string");
    }
  }

  array(depth: number): JsonValue[] {
    const items: JsonValue[] = [];
    this.pos++; // [
    this.skipWhitespace();
    if (this.text[this.pos] === "]") {
      this.pos++;
      return items;
    }
    for (;;) {
      this.skipWhitespace();
      items.push(this.value(depth + 1));
      this.skipWhitespace();
      const c = this.text[this.pos++];
      if (c === "]") return items;
      if (c !== ",") {
        this.pos--;
        this.fail("expected , or ]");
      }
    }
  }

  object(depth: number): JsonObject {
    const obj: JsonObject = {};
    this.pos++; // {
    this.skipWhitespace();
    if (this.text[this.pos] === "}") {
      this.pos++;
      return obj;
    }
    for (;;) {
      this.skipWhitespace();
      if (this.text[this.pos] !== '"') this.fail("expected a key");
      const key = this.string();
      this.skipWhitespace();
      if (this.text[this.pos++] !== ":") {
        this.pos--;
        this.fail("expected :");
      }
      this.skipWhitespace();
      const value = this.value(depth + 1);
      // A plain assignment of "__proto__" would set the prototype instead of a key.
      Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });
      this.skipWhitespace();
      const c = this.text[this.pos++];
      if (c === "}") return obj;
      if (c !== ",") {
        this.pos--;
        this.fail("expected , or }");
      }
    }
  }
}

function write(value: unknown, seen: Set<object>): string | undefined {
  if (value !== null && typeof value === "object" && typeof (value as { toJSON?: unknown }).toJSON === "function") {
    value = (value as { toJSON(): unknown }).toJSON();
  }
  switch (typeof value) {
    case "string":
      return JSON.stringify(value);
    case "number":
      if (!Number.isFinite(value)) throw new TypeError(`JSON cannot carry ${value}`);
      return String(value);
    case "bigint":
      return value.toString();
    case "boolean":
      return value ? "true" : "false";
    case "undefined":
    case "function":
    case "symbol":
      return undefined;
  }
  if (value === null) return "null";
  const obj = value as object;
  if (seen.has(obj)) throw new TypeError("cannot write a cyclic structure as JSON");
  seen.add(obj);
  try {
    if (Array.isArray(obj)) {
      return `[${obj.map((item) => write(item, seen) ?? "null").join(",")}]`;
    }
    const parts: string[] = [];
    for (const [key, item] of Object.entries(obj)) {
      const text = write(item, seen);
      if (text !== undefined) parts.push(`${JSON.stringify(key)}:${text}`);
    }
    return `{${parts.join(",")}}`;
  } finally {
    seen.delete(obj);
  }
}
