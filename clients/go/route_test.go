package aaa

import (
	"testing"

	"google.golang.org/grpc"
)

// The shard of a run id: see TestVectorsShardOfARun.

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
