package aaa

import (
	"testing"

	"google.golang.org/grpc"
)

func TestShardOfARun(t *testing.T) {
	for runID, want := range map[string]int{
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a00": 0,
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a7f": 127,
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5aFF": 255,
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5ab3": 0xb3,
	} {
		if got, ok := shardOf(runID); !ok || got != want {
			t.Errorf("shardOf(%q) = %d, %v; want %d", runID, got, ok, want)
		}
	}
	for _, runID := range []string{"", "a", "run-xz", "r1-"} {
		if shard, ok := shardOf(runID); ok {
			t.Errorf("shardOf(%q) = %d, want no shard", runID, shard)
		}
	}
}

func TestOwnerOfARunIsOneOfTheClientsAddresses(t *testing.T) {
	owners := make([]string, shardCount)
	owners[0x01] = "127.0.0.1:7001"
	owners[0x02] = "10.0.0.9:7002"  // a server the client was not given
	owners[0x03] = "localhost:7001" // the same server by another name: not matched
	known := map[string]*grpc.ClientConn{"127.0.0.1:7001": nil, "127.0.0.1:7003": nil}
	for runID, want := range map[string]string{
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a01": "127.0.0.1:7001",
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a02": "",
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a03": "",
		"0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a04": "", // no owner
		"not-a-run":                            "",
	} {
		if got := ownerOf(owners, known, runID); got != want {
			t.Errorf("ownerOf(%q) = %q, want %q", runID, got, want)
		}
	}
	if got := ownerOf(nil, known, "0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a01"); got != "" {
		t.Errorf("ownerOf with no map = %q, want round robin", got)
	}
}
