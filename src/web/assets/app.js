// aaa web inbox: live updates over Server-Sent Events. The pages work
// without it; this file only keeps them current. Rows arrive rendered and
// escaped by the server; nothing here builds markup from data.
"use strict";
(function () {
  var body = document.body;
  var baseTitle = body.getAttribute("data-title") || document.title;
  var inbox = document.getElementById("inbox");
  var notice = document.getElementById("notice");

  // The approver-name form (auth off) comes back to this page once saved.
  var here = document.querySelector("input[data-here]");
  if (here) here.value = location.pathname;

  function setCount(n) {
    document.title = (n > 0 ? "(" + n + ") " : "") + baseTitle;
    var count = document.getElementById("count");
    if (count) count.textContent = n > 0 ? String(n) : "";
    var pending = document.getElementById("pending");
    if (pending) pending.textContent = String(n);
  }

  function rowOf(key) {
    if (!inbox) return null;
    for (var i = 0; i < inbox.children.length; i++) {
      if (inbox.children[i].getAttribute("data-key") === key) return inbox.children[i];
    }
    return null;
  }

  function showEmpty() {
    var empty = document.getElementById("empty");
    if (empty && inbox) empty.hidden = inbox.children.length > 0;
  }

  function fragment(html) {
    var holder = document.createElement("template");
    holder.innerHTML = html;
    return holder.content.firstElementChild;
  }

  // A row added above what the reader looks at must not move it.
  function insertTop(row) {
    var before = window.scrollY;
    inbox.insertBefore(row, inbox.firstChild);
    if (before > 0) window.scrollBy(0, row.getBoundingClientRect().height);
  }

  function decidedHere(key) {
    if (!notice || notice.getAttribute("data-key") !== key) return;
    if (notice.textContent === "") {
      notice.textContent = "This call was decided meanwhile; reload to see how.";
    }
    var buttons = document.querySelectorAll(".decide button");
    for (var i = 0; i < buttons.length; i++) buttons[i].disabled = true;
  }

  var live = body.getAttribute("data-live");
  if (live) {
    var approvals = new EventSource(live);
    approvals.addEventListener("count", function (e) {
      setCount(JSON.parse(e.data).count);
    });
    approvals.addEventListener("requested", function (e) {
      var d = JSON.parse(e.data);
      if (inbox && inbox.getAttribute("data-tail") === "1" && !rowOf(d.key)) {
        var row = fragment(d.row);
        if (inbox.getAttribute("data-order") === "newest") insertTop(row);
        else inbox.appendChild(row);
        showEmpty();
      }
      setCount(d.count);
    });
    approvals.addEventListener("resolved", function (e) {
      var d = JSON.parse(e.data);
      var row = rowOf(d.key);
      if (row) {
        var above = row.getBoundingClientRect().bottom < 0;
        var height = row.getBoundingClientRect().height;
        row.parentNode.removeChild(row);
        if (above) window.scrollBy(0, -height);
        showEmpty();
      }
      decidedHere(d.key);
      setCount(d.count);
    });
    approvals.addEventListener("voted", function (e) {
      var d = JSON.parse(e.data);
      var row = rowOf(d.key);
      var votes = row && row.querySelector(".votes");
      if (votes) votes.textContent = d.votes;
    });
  }

  var timeline = document.getElementById("timeline");
  var feed = timeline && timeline.getAttribute("data-events");
  if (feed) {
    var events = new EventSource(feed);
    events.addEventListener("event", function (e) {
      var d = JSON.parse(e.data);
      var last = timeline.lastElementChild;
      var lastSeq = last ? Number(last.getAttribute("data-seq")) : 0;
      if (d.seq > lastSeq) timeline.appendChild(fragment(d.item));
      if (d.ended) {
        var status = document.getElementById("run-status");
        if (status) {
          status.textContent = d.ended;
          status.className = "status " + d.ended;
        }
        events.close();
      }
    });
  }
})();
