package aaa

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"os"
	"strings"
	"testing"
)

// vectors are the cross-language test vectors, computed by the server's own
// functions (see the file's "about").
type vectors struct {
	RunShards struct {
		Shards int `json:"shards"`
		Cases  []struct {
			RunID string `json:"run_id"`
			Shard int    `json:"shard"`
		} `json:"cases"`
		NotRunIDs []string `json:"not_run_ids"`
	} `json:"run_shards"`
	CanonicalJSON struct {
		Cases []struct {
			Name      string `json:"name"`
			Input     string `json:"input"`
			Canonical string `json:"canonical"`
			SHA256    string `json:"sha256"`
		} `json:"cases"`
	} `json:"canonical_json"`
}

func readVectors(t *testing.T) vectors {
	t.Helper()
	data, err := os.ReadFile("../../tests/vectors/formats.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVectorsShardOfARun(t *testing.T) {
	v := readVectors(t)
	if v.RunShards.Shards != shardCount {
		t.Errorf("the server has %d shards, this SDK %d", v.RunShards.Shards, shardCount)
	}
	for _, c := range v.RunShards.Cases {
		if got, ok := shardOf(c.RunID); !ok || got != c.Shard {
			t.Errorf("shardOf(%q) = %d, %v; want %d", c.RunID, got, ok, c.Shard)
		}
	}
	for _, text := range v.RunShards.NotRunIDs {
		if shard, ok := shardOf(text); ok {
			t.Errorf("shardOf(%q) = %d, want no shard", text, shard)
		}
	}
}

func TestVectorsCanonicalJSONAndItsDigest(t *testing.T) {
	for _, c := range readVectors(t).CanonicalJSON.Cases {
		t.Run(c.Name, func(t *testing.T) {
			// The digest approvers see is the SHA-256 of the canonical text.
			if sum := sha256.Sum256([]byte(c.Canonical)); hex.EncodeToString(sum[:]) != c.SHA256 {
				t.Errorf("sha256 = %x, want %s", sum, c.SHA256)
			}
			// Canonicalizing changes no value this SDK reads (a json.Number keeps the
			// text it was given, and the server writes exponents as e+N: compared as numbers).
			var input, canonical any
			if err := DecodeJSON([]byte(c.Input), &input); err != nil {
				t.Fatal(err)
			}
			if err := DecodeJSON([]byte(c.Canonical), &canonical); err != nil {
				t.Fatal(err)
			}
			if !sameJSON(input, canonical) {
				t.Errorf("input decodes to %#v, canonical to %#v", input, canonical)
			}
			// What it writes of the value is the canonical text (numbers are kept as
			// written, map keys sorted), except that encoding/json always escapes
			// U+2028 and U+2029.
			out, err := EncodeJSON(canonical)
			if err != nil {
				t.Fatal(err)
			}
			want := strings.NewReplacer("\u2028", `\u2028`, "\u2029", `\u2029`).Replace(c.Canonical)
			if string(out) != want {
				t.Errorf("EncodeJSON wrote\n%s\nwant\n%s", out, want)
			}
		})
	}
}

// sameJSON reports whether two values decoded by DecodeJSON are the same JSON
// value: numbers compared by their value, exactly.
func sameJSON(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, _, errA := big.ParseFloat(string(a), 10, 4096, big.ToNearestEven)
		y, _, errB := big.ParseFloat(string(b), 10, 4096, big.ToNearestEven)
		return errA == nil && errB == nil && x.Cmp(y) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for key, item := range a {
			other, ok := b[key]
			if !ok || !sameJSON(item, other) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}
