package aaa

import (
	"context"
	"strconv"
	"sync"
	"time"

	"aaa.dev/clients/go/aaav1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A server of a cluster that does not own a run forwards the run's writes to
// the server that does, which costs the cluster CPU and the call a hop. So a
// client of several servers sends a run's writes (Signal, CancelRun, and a
// task's HeartbeatTask, CompleteTask and FailTask) straight to its owner,
// as GetCluster names it; every other call goes round robin. The map of owners
// may be stale: a call sent to a server that no longer owns the run is
// forwarded as before, so routing only saves the hop, never changes a call.

// ownersMaxAge is how old the map of owners may get before a routed call
// refreshes it (in the background).
const ownersMaxAge = 5 * time.Second

// ownersReadTimeout bounds one GetCluster read of the owners.
const ownersReadTimeout = 5 * time.Second

// shardCount is how many shards the runs are spread over.
const shardCount = 256

// shardOf returns the shard of a run: the last byte of its id, the id's last
// two hex digits. False for an id that does not end with two hex digits.
func shardOf(runID string) (int, bool) {
	if len(runID) < 2 {
		return 0, false
	}
	shard, err := strconv.ParseUint(runID[len(runID)-2:], 16, 8)
	return int(shard), err == nil
}

// ownerOf returns the address of the server that owns runID's shard, by
// owners (shard -> address), when it is one of known (the addresses the
// client was given, compared as strings); "" when the shard has no owner, the
// owner is a server the client was not given, or the id has no shard.
func ownerOf(owners []string, known map[string]*grpc.ClientConn, runID string) string {
	shard, ok := shardOf(runID)
	if !ok || shard >= len(owners) {
		return ""
	}
	if _, ok := known[owners[shard]]; !ok {
		return ""
	}
	return owners[shard]
}

// ownerRoutes picks the connection for a run's writes: one connection per
// server address of DialCluster, made on first use, or the round robin.
type ownerRoutes struct {
	roundRobin *grpc.ClientConn
	connect    func(address string) (*grpc.ClientConn, error)

	mu sync.Mutex
	// conns has a key for each address the client was given; its value is
	// the connection to that server, nil until first used.
	conns map[string]*grpc.ClientConn
	// owners is the address of each shard's owner ("" for none), from the
	// last GetCluster read; nil until one succeeds, and while the store is
	// embedded (separate embedded servers each claim every shard).
	owners []string
	// readAt is when owners was read; zero to read them again at the next
	// routed call.
	readAt time.Time
	// reading is closed when the GetCluster read in flight ends; nil when
	// none is in flight.
	reading chan struct{}
	closed  bool
}

// newOwnerRoutes returns the routes of a client of the servers at addresses,
// whose round robin is roundRobin, and starts reading the owners (best
// effort: until a read succeeds, writes go round robin). connect makes the
// connection to one server.
func newOwnerRoutes(addresses []string, roundRobin *grpc.ClientConn, connect func(string) (*grpc.ClientConn, error)) *ownerRoutes {
	r := &ownerRoutes{roundRobin: roundRobin, connect: connect, conns: map[string]*grpc.ClientConn{}}
	for _, address := range addresses {
		r.conns[address] = nil
	}
	r.mu.Lock()
	r.startReading()
	r.mu.Unlock()
	return r
}

// of returns the connection for the writes of run runID.
func (r *ownerRoutes) of(runID string) grpc.ClientConnInterface {
	return writeConn{r, runID}
}

// writeConn is a connection for one run's writes: each call goes to the
// run's owner when known, else round robin.
type writeConn struct {
	routes *ownerRoutes
	runID  string
}

func (w writeConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	conn, routed := w.routes.pick(w.runID)
	err := conn.Invoke(ctx, method, args, reply, opts...)
	if routed && status.Code(err) == codes.Unavailable {
		w.routes.markStale() // the owner may have gone, and its runs moved
	}
	return err
}

func (w writeConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return w.routes.roundRobin.NewStream(ctx, desc, method, opts...) // no write is a stream
}

// pick returns the connection to runID's owner (routed) or the round robin,
// and starts reading the owners again when they are too old.
func (r *ownerRoutes) pick(runID string) (conn *grpc.ClientConn, routed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.roundRobin, false
	}
	if time.Since(r.readAt) > ownersMaxAge {
		r.startReading()
	}
	address := ownerOf(r.owners, r.conns, runID)
	if address == "" {
		return r.roundRobin, false
	}
	if r.conns[address] == nil {
		c, err := r.connect(address)
		if err != nil {
			return r.roundRobin, false
		}
		r.conns[address] = c
	}
	return r.conns[address], true
}

// markStale forgets the owners until they are read again, which the next
// write starts: meanwhile writes go round robin, so the SDK's retry of a call
// whose owner died reaches a live server (which waits for the next owner)
// instead of the dead one again.
func (r *ownerRoutes) markStale() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.readAt = time.Time{}
	r.owners = nil
}

// startReading reads the owners from GetCluster (any server, round robin) in
// the background, unless a read is in flight. r.mu must be held.
func (r *ownerRoutes) startReading() {
	if r.reading != nil {
		return
	}
	done := make(chan struct{})
	r.reading = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), ownersReadTimeout)
		defer cancel()
		resp, err := aaav1.NewClusterServiceClient(r.roundRobin).GetCluster(ctx, &aaav1.GetClusterRequest{})
		r.mu.Lock()
		defer r.mu.Unlock()
		r.reading = nil
		if err != nil {
			return // best effort: keep what we had, and try again at the next routed call
		}
		r.readAt = time.Now()
		r.owners = nil
		if resp.GetStore() != "embedded" && len(resp.GetShardOwners()) == shardCount {
			r.owners = resp.GetShardOwners()
		}
	}()
}

// readInFlight returns a channel closed when the read of the owners in flight
// ends; nil when none is.
func (r *ownerRoutes) readInFlight() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reading
}

// close closes the connections to the owners.
func (r *ownerRoutes) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, conn := range r.conns {
		if conn != nil {
			conn.Close()
		}
	}
}
