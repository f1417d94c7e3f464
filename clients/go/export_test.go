package aaa

import "google.golang.org/grpc/connectivity"

// Routing waits for the read of the owners in flight (the one DialCluster
// starts) and reports whether c has read them (GetCluster answered), and
// whether it sends a run's writes to its owner.
func Routing(c *Client) (read, routing bool) {
	if c.owners == nil {
		return false, false
	}
	if reading := c.owners.readInFlight(); reading != nil {
		<-reading
	}
	c.owners.mu.Lock()
	defer c.owners.mu.Unlock()
	return !c.owners.readAt.IsZero(), c.owners.owners != nil
}

// OwnerConnReady reports whether the client's own connection to address
// (made on its first routed write) is connected: a routed write that could
// not use it would have gone round robin, which may reach the owner too.
func OwnerConnReady(c *Client, address string) bool {
	if c.owners == nil {
		return false
	}
	c.owners.mu.Lock()
	defer c.owners.mu.Unlock()
	conn := c.owners.conns[address]
	return conn != nil && conn.GetState() == connectivity.Ready
}
