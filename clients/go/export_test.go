package aaa

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
