#include "daemon/pool/peer_link.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "daemon/log.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::ChunkKind;
using transport::MessageType;

PeerLink::PeerLink(asio::io_context& io, PeerLinkConfig config, PeerLinkEvents events)
    : strand_(asio::make_strand(io)),
      config_(std::move(config)),
      events_(std::move(events)),
      socket_(strand_),
      connect_timer_(strand_) {}

PeerLink::~PeerLink() = default;

std::shared_ptr<PeerLink> PeerLink::open(asio::io_context& io, PeerLinkConfig config,
                                         PeerLinkEvents events) {
  std::shared_ptr<PeerLink> link(new PeerLink(io, std::move(config), std::move(events)));
  link->connect_deadline_ = std::chrono::steady_clock::now() + link->config_.connect_timeout;
  transport::Endpoint where;
  try {
    where = transport::parse_endpoint(link->config_.endpoint);
  } catch (const std::exception& e) {
    LinkError err = link->lost_error(e.what());
    err.never_connected = true;
    link->later([link, err] { link->fail(err, /*raise_lost=*/true); });
    return link;
  }
  if (!where.is_tcp()) {
    link->address_ = asio::local::stream_protocol::endpoint(where.path);
    link->connect();
    return link;
  }
  // A host name is resolved without blocking the io thread (a DNS lookup may take seconds).
  auto resolver = std::make_shared<asio::ip::tcp::resolver>(link->strand_);
  resolver->async_resolve(
      where.host, std::to_string(where.port),
      [link, resolver, where](const boost::system::error_code& ec,
                              const asio::ip::tcp::resolver::results_type& results) {
        if (link->closed_ || link->failure_) return;
        if (ec || results.empty()) {
          LinkError err{LinkError::Kind::lost, ErrorCode::peer_lost,
                        "endpoint '" + where.text + "': cannot resolve '" + where.host +
                            "': " + (ec ? ec.message() : std::string("no address")),
                        /*never_connected=*/true};
          link->fail(err, /*raise_lost=*/true);
          return;
        }
        link->address_ = results.begin()->endpoint();
        link->connect();
      });
  return link;
}

std::string PeerLink::ms_text(std::chrono::milliseconds ms) const {
  return std::to_string(ms.count()) + " ms";
}

LinkError PeerLink::lost_error(const std::string& why) const {
  return {LinkError::Kind::lost, ErrorCode::peer_lost,
          "connection to muon-offloadd at '" + config_.endpoint + "' lost (" + why + ")"};
}

void PeerLink::later(std::function<void()> fn) {
  asio::post(strand_, [self = shared_from_this(), fn = std::move(fn)] {
    if (!self->closed_) fn();
  });
}

std::shared_ptr<asio::steady_timer> PeerLink::timer_after(std::chrono::milliseconds d,
                                                          std::function<void()> on_expiry) {
  auto t = std::make_shared<asio::steady_timer>(strand_, d);
  t->async_wait([self = shared_from_this(), on_expiry = std::move(on_expiry)](
                    const boost::system::error_code& ec) {
    if (!ec && !self->closed_) on_expiry();
  });
  return t;
}

// ---- connecting --------------------------------------------------------------------------------

void PeerLink::connect() {
  socket_.async_connect(address_, [self = shared_from_this()](const boost::system::error_code& ec) {
    self->on_connect(ec);
  });
}

void PeerLink::on_connect(const boost::system::error_code& ec) {
  if (closed_ || failure_) return;
  if (ec) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    const auto now = std::chrono::steady_clock::now();
    if (now >= connect_deadline_) {
      LinkError err{LinkError::Kind::lost, ErrorCode::peer_lost,
                    "cannot connect to muon-offloadd at '" + config_.endpoint + "' within " +
                        ms_text(config_.connect_timeout) + ": " + ec.message() +
                        " (is the server running? see `muon-offloadd --help`)",
                    /*never_connected=*/true};
      fail(err, /*raise_lost=*/true);
      return;
    }
    // The last try is at the deadline itself.
    connect_timer_.expires_at(std::min(now + backoff_, connect_deadline_));
    backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(1000));
    connect_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e && !self->closed_ && !self->failure_) self->connect();
    });
    return;
  }
  transport::tune_connected(socket_, transport::parse_endpoint(config_.endpoint));
  read();
  // The token proves a tcp peer; a Unix socket peer is checked by uid and never gets it.
  const bool tcp = transport::parse_endpoint(config_.endpoint).is_tcp();
  write(MessageType::hello,
        transport::encode(transport::Hello{config_.rank, config_.world_size, config_.client_name,
                                           config_.data_plane,
                                           tcp ? config_.auth_token : std::string(),
                                           config_.relay_server, config_.replica_server}),
        /*request_id=*/1);
  hello_timer_ = timer_after(config_.op_timeout, [this] {
    if (hello_answered_ || failure_) return;
    fail({LinkError::Kind::timeout, ErrorCode::timeout,
          "no answer from muon-offloadd at '" + config_.endpoint + "' within " +
              ms_text(config_.op_timeout) + " to the hello",
          true},
         /*raise_lost=*/true);
  });
}

void PeerLink::on_hello(const transport::Frame& f) {
  hello_answered_ = true;
  if (hello_timer_) hello_timer_->cancel();
  const auto ok = transport::decode<transport::HelloOk>(f.payload);
  if (ok.data_plane != config_.data_plane) {
    fail({LinkError::Kind::refused, ErrorCode::unsupported,
          "muon-offloadd at '" + config_.endpoint + "' answered a hello asking for data plane " +
              transport::data_plane_name(config_.data_plane) + " with data plane " +
              transport::data_plane_name(ok.data_plane),
          true},
         /*raise_lost=*/true);
    return;
  }
  std::weak_ptr<PeerLink> weak = shared_from_this();
  try {
    plane_ = make_link_plane(ok, config_.device, config_.op_timeout,
                             [weak, strand = strand_](std::function<void()> fn) {
                               asio::post(strand, [weak, fn = std::move(fn)] {
                                 if (auto self = weak.lock(); self && !self->closed_) fn();
                               });
                             });
  } catch (const std::exception& e) {
    fail({LinkError::Kind::lost, ErrorCode::peer_lost,
          "the data plane toward muon-offloadd at '" + config_.endpoint +
              "' cannot be set up: " + e.what(),
          true},
         /*raise_lost=*/true);
    return;
  }
  credits_.assign(ok.tx_slots);
  if (auto words = plane_->tx_credit_words()) credits_.use_segment(*words);
  chunk_bytes_ = transport::push_chunk_bytes(ok);
  if (events_.connected) events_.connected(ok);
  pump();
}

// ---- the queue of calls ------------------------------------------------------------------------

void PeerLink::register_param(const transport::RegisterParam& reg, RegisterDone done) {
  const uint32_t id = next_request_++;
  if (failure_) {
    later([done = std::move(done), err = *failure_] { done(err, {}); });
    return;
  }
  replies_[id] = Reply{reg.name, std::move(done), nullptr};
  if (!reg.replica) registering_.insert(reg.name);
  Op op;
  op.type = MessageType::register_param;
  op.payload = transport::encode(reg);
  op.request_id = id;
  ops_.push_back(std::move(op));
  pump();
}

void PeerLink::expect_updates(const std::string& name, std::vector<transport::Range> want,
                              transport::DType update_dtype, bool packed) {
  Receiving r;
  r.want = RangeSet::union_of(std::move(want));
  r.dtype = update_dtype;
  r.packed = packed;
  receiving_[name] = std::move(r);
}

void PeerLink::push(const std::string& name, int64_t step, int64_t offset,
                    std::span<const std::byte> bytes, transport::DType dtype, ChunkKind kind,
                    std::shared_ptr<const void> keep, Done done) {
  if (failure_) {
    later([done = std::move(done), err = *failure_] { done(err); });
    return;
  }
  Op op;
  op.is_push = true;
  op.name = name;
  op.step = step;
  op.offset = offset;
  op.count = static_cast<int64_t>(bytes.size() / transport::dtype_bytes(dtype));
  op.dtype = dtype;
  op.kind = kind;
  op.data = bytes.data();
  op.keep = std::move(keep);
  op.done = std::move(done);
  ops_.push_back(std::move(op));
  pump();
}

void PeerLink::commit(const std::string& name, int64_t step, Done done) {
  if (failure_) {
    later([done = std::move(done), err = *failure_] { done(err); });
    return;
  }
  Op op;
  op.type = MessageType::commit;
  // The attempt is read when the frame goes out (an error may arrive meanwhile).
  op.name = name;
  op.step = step;
  op.done = std::move(done);
  ops_.push_back(std::move(op));
  pump();
}

void PeerLink::fetch_momentum(const std::string& name, int64_t numel, int64_t after_step,
                              FetchDone done) {
  if (failure_) {
    later([done = std::move(done), err = *failure_] { done(err, {}, -1); });
    return;
  }
  Fetch f;
  f.values.assign(static_cast<size_t>(numel), 0.0f);
  f.done = std::move(done);
  fetches_[name].push_back(std::move(f));
  Op op;
  op.type = MessageType::state_fetch;
  op.payload = transport::encode(transport::StateFetch{name, after_step});
  op.name = name;
  ops_.push_back(std::move(op));
  pump();
}

uint32_t PeerLink::wire_id(const std::string& name, ChunkKind kind) const {
  if (kind == ChunkKind::replica_momentum || kind == ChunkKind::replica_update) {
    return transport::kNoParamId;  // the chunk carries the name (its seal follows)
  }
  const auto it = param_ids_.find(name);
  // No id: a registration not answered on this link; the name travels and the peer refuses it
  // by name (unknown parameter, not part of it).
  return it == param_ids_.end() ? transport::kNoParamId : it->second;
}

uint32_t PeerLink::attempt_of(const std::string& name, int64_t step) const {
  const auto it = attempts_.find({name, step});
  return it == attempts_.end() ? 0 : it->second;
}

void PeerLink::pump() {
  if (!hello_answered_ || !plane_) return;
  try {
    pump_ops();
  } catch (const std::exception& e) {  // a frame too large, a slot the segment lacks
    fail(lost_error(std::string("cannot send to it: ") + e.what()), /*raise_lost=*/true);
  }
}

void PeerLink::pump_ops() {
  while (!failure_ && !ops_.empty()) {
    Op& op = ops_.front();
    if (!op.is_push) {
      if (op.type == MessageType::commit) {
        op.payload = transport::encode(
            transport::Commit{op.name, op.step, attempt_of(op.name, op.step)});
      }
      if (op.request_id != 0) {
        auto it = replies_.find(op.request_id);
        if (it != replies_.end()) {
          const uint32_t id = op.request_id;
          it->second.timer = timer_after(config_.op_timeout, [this, id] {
            auto r = replies_.find(id);
            if (r == replies_.end()) return;
            auto reply = std::move(r->second);
            replies_.erase(r);
            registering_.erase(reply.name);
            reply.done(LinkError{LinkError::Kind::timeout, ErrorCode::timeout,
                        "no answer from muon-offloadd at '" + config_.endpoint + "' within " +
                            ms_text(config_.op_timeout) + " to the registration of '" +
                            reply.name + "'"},
                       {});
            pump();  // pushes that waited for its id go by name
          });
        }
      }
      if (op.type == MessageType::state_fetch) {
        auto& queue = fetches_[op.name];
        // The fetch whose frame this is: the first not yet timed (FIFO, as the peer answers).
        for (auto& f : queue) {
          if (f.timer) continue;
          const std::string name = op.name;
          Fetch* target = &f;
          f.timer = timer_after(config_.op_timeout, [this, name, target] {
            for (auto& g : fetches_[name]) {
              if (&g != target || !g.done) continue;
              auto done = std::move(g.done);
              g.done = nullptr;  // its chunks, should they come, still land here
              done(LinkError{LinkError::Kind::timeout, ErrorCode::timeout,
                    "momentum of '" + name + "' not received from '" + config_.endpoint +
                        "' within " + ms_text(config_.op_timeout)},
                   {}, -1);
            }
          });
          break;
        }
      }
      write(op.type, op.payload, op.request_id);
      if (op.done) later([done = std::move(op.done)] { done(std::nullopt); });
      ops_.pop_front();
      continue;
    }
    // A push of a parameter whose registration is on its way waits for its id.
    if (wire_id(op.name, op.kind) == transport::kNoParamId && registering_.count(op.name)) return;
    if (!frame_chunks(op)) return;  // waits for a credit
    ops_.pop_front();
  }
}

bool PeerLink::frame_chunks(Op& op) {
  if (!op.end) {
    op.end = std::make_shared<PushEnd>();
    op.end->keep = op.keep;
    op.end->done = std::move(op.done);
    push_ends_.insert(op.end);
  }
  const auto end = op.end;
  const size_t esize = transport::dtype_bytes(op.dtype);
  const int64_t per_slot = static_cast<int64_t>(chunk_bytes_ / esize);
  // An empty push still says so in one frame (count 0), as the trainer's client does.
  bool framed_empty = false;
  while (op.sent < op.count || (op.count == 0 && !framed_empty)) {
    auto slot = credits_.acquire();
    // None free (shm: as the segment says now): ask for a wake frame, then look once more.
    if (!slot && credits_.any_free(transport::CreditRing::IfNot::ask_wake)) {
      slot = credits_.acquire();
    }
    if (!slot) {
      if (!stall_timer_) {
        stall_timer_ = timer_after(config_.op_timeout, [this, name = op.name, step = op.step] {
          fail({LinkError::Kind::timeout, ErrorCode::timeout,
                "no free " + std::string(transport::data_plane_name(config_.data_plane)) +
                    " ring slot to push '" + name + "' step " + std::to_string(step) +
                    " to muon-offloadd at '" + config_.endpoint + "' within " +
                    ms_text(config_.op_timeout) + " (the server is not draining the ring)"},
               /*raise_lost=*/true);
        });
      }
      return false;
    }
    if (stall_timer_) {
      stall_timer_->cancel();
      stall_timer_.reset();
    }
    const int64_t n = std::min(per_slot, op.count - op.sent);
    const std::byte* src = op.data + static_cast<size_t>(op.sent) * esize;
    const size_t bytes = static_cast<size_t>(n) * esize;
    const transport::Push m{op.name, op.step,  op.offset + op.sent,          n,
                            *slot,   op.kind, attempt_of(op.name, op.step), wire_id(op.name, op.kind)};
    if (!plane_->sends_after_frame()) {
      plane_->fill_slot(*slot, src, bytes);
      write(MessageType::push, transport::encode(m), 0);
    } else {
      // The peer posts its receive when it reads the frame: the send goes once the frame is in
      // the socket, never before (a send spinning for a frame not written: gpu-review F1).
      ++end->sends;
      write(MessageType::push, transport::encode(m), 0, [this, src, bytes, dtype = op.dtype, end] {
        plane_->send(src, bytes, dtype, [this, end](std::string error) {
          --end->sends;
          if (!error.empty() && !end->result) {
            end->result = lost_error("the nccl data plane failed: " + error);
            fail(*end->result, /*raise_lost=*/true);
          }
          finish_push(end);
        });
      });
    }
    op.sent += n;
    framed_empty = op.count == 0;
  }
  end->framed = true;
  finish_push(end);
  return true;
}

void PeerLink::finish_push(const std::shared_ptr<PushEnd>& end) {
  if (!end->framed || end->sends > 0) return;
  push_ends_.erase(end);
  if (end->done) {
    later([done = std::move(end->done), result = end->result] { done(result); });
    end->done = nullptr;
  }
  end->keep.reset();
}

// ---- writing and reading -----------------------------------------------------------------------

void PeerLink::write(MessageType type, const std::string& payload, uint32_t request_id,
                     std::function<void()> after_written) {
  writes_.push_back(
      {transport::encode_frame(transport::Frame{static_cast<uint16_t>(type), request_id, payload}),
       std::move(after_written)});
  if (!writing_) write_next();
}

void PeerLink::write_next() {
  if (writes_.empty() || failure_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(writes_.front().bytes),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      // A link that leaves (leave()) still writes its goodbye.
                      if (self->failure_ || (self->closed_ && !self->leaving_)) return;
                      if (ec) {
                        self->fail(self->lost_error("write failed: " + ec.message()),
                                   /*raise_lost=*/true);
                        return;
                      }
                      Write done = std::move(self->writes_.front());
                      self->writes_.pop_front();
                      if (done.after_written && (!self->closed_ || done.when_leaving)) {
                        done.after_written();
                      }
                      self->write_next();
                    });
}

void PeerLink::read() {
  socket_.async_read_some(
      asio::buffer(read_buf_),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
        if (self->closed_ || self->failure_) return;
        if (ec) {
          self->fail(self->lost_error(ec == asio::error::eof ? "the server closed the connection"
                                                             : ec.message()),
                     /*raise_lost=*/true);
          return;
        }
        try {
          self->decoder_.feed(self->read_buf_.data(), n);
          while (auto f = self->decoder_.next()) {
            self->handle(std::move(*f));
            if (self->closed_ || self->failure_) return;
          }
        } catch (const std::exception& e) {
          self->fail(self->lost_error(std::string("bad data from the server: ") + e.what()),
                     /*raise_lost=*/true);
          return;
        }
        self->read();
      });
}

void PeerLink::handle(transport::Frame f) {
  const auto type = static_cast<MessageType>(f.type);
  if (!hello_answered_) {
    if (type == MessageType::hello_ok && f.request_id == 1) return on_hello(f);
    if (type == MessageType::error) {
      const auto e = transport::decode<transport::ErrorMsg>(f.payload);
      hello_answered_ = true;
      if (hello_timer_) hello_timer_->cancel();
      fail({LinkError::Kind::refused, e.code,
            "muon-offloadd at '" + config_.endpoint + "' refused the hello: " + e.message, true},
           /*raise_lost=*/true);
      return;
    }
    throw transport::ProtocolError("a " + transport::message_type_name(f.type) +
                                   " frame before the answer to the hello");
  }
  switch (type) {
    case MessageType::update:
      on_update(transport::decode<transport::Update>(f.payload));
      return;
    case MessageType::push_ack:
      // An ack for a slot not held changes nothing; on shm it only wakes the link (the slot's
      // release is in the segment's credit words).
      (void)credits_.release(transport::decode<transport::SlotAck>(f.payload).slot);
      pump();
      return;
    case MessageType::register_ok:
      on_register_ok(f);
      return;
    case MessageType::error:
      on_error(transport::decode<transport::ErrorMsg>(f.payload), f.request_id);
      return;
    default:
      return;  // nothing else is asked on a link
  }
}

void PeerLink::on_register_ok(const transport::Frame& f) {
  const auto ok = transport::decode<transport::RegisterOk>(f.payload);
  if (ok.param_id != transport::kNoParamId) {
    param_ids_[ok.name] = ok.param_id;
    param_names_[ok.param_id] = ok.name;
  }
  auto it = replies_.find(f.request_id);
  if (it != replies_.end()) {
    auto reply = std::move(it->second);
    replies_.erase(it);
    if (reply.timer) reply.timer->cancel();
    registering_.erase(reply.name);
    reply.done(std::nullopt, ok);
  }
  pump();
}

void PeerLink::on_error(transport::ErrorMsg e, uint32_t request_id) {
  if (request_id != 0) {
    auto it = replies_.find(request_id);
    if (it != replies_.end()) {
      auto reply = std::move(it->second);
      replies_.erase(it);
      if (reply.timer) reply.timer->cancel();
      registering_.erase(reply.name);
      reply.done(LinkError{LinkError::Kind::refused, e.code,
                           "muon-offloadd at '" + config_.endpoint + "' refused the registration "
                           "of '" + reply.name + "': " + e.message},
                 {});
      pump();
      return;
    }
  }
  if (!e.param.empty()) {
    // What this link pushes for the step from now on is a new try (transport::Push::attempt).
    if (e.step >= 0) ++attempts_[{e.param, e.step}];
    // A fetch's refusal: a fetch has no request id. A registration's refusal that came after its
    // reply timed out names its parameter with step -1 too, but carries its request id.
    if (e.step < 0 && request_id == 0) {
      auto f = fetches_.find(e.param);
      if (f != fetches_.end() && !f->second.empty()) {
        auto done = std::move(f->second.front().done);
        if (f->second.front().timer) f->second.front().timer->cancel();
        f->second.pop_front();
        if (done) {
          done(LinkError{LinkError::Kind::refused, e.code,
                         "muon-offloadd at '" + config_.endpoint + "': " + e.message},
               {}, -1);
        }
        return;
      }
    }
    if (events_.error) events_.error(e);
    return;
  }
  if (e.code == ErrorCode::peer_lost && e.rank >= 0) {
    // A compute rank of the job was lost: a step that needs it fails with its own error.
    log()->debug("{} says: {}", config_.endpoint, e.message);
    return;
  }
  if (e.code == ErrorCode::shutdown) {
    fail(lost_error("the server is shutting down: " + e.message), /*raise_lost=*/true);
    return;
  }
  if (events_.error) events_.error(e);
}

void PeerLink::on_update(transport::Update u) {
  if (u.param_id != transport::kNoParamId) {
    const auto id = param_names_.find(u.param_id);
    if (id == param_names_.end()) {
      throw transport::ProtocolError("update names parameter id " + std::to_string(u.param_id) +
                                     ", which the server never handed out on this link");
    }
    u.name = id->second;
  }
  const uint32_t slot = u.slot;
  auto ack = [this, slot](std::string error) {
    if (!error.empty()) {
      fail(lost_error("the data plane failed: " + error), /*raise_lost=*/true);
      return;
    }
    write(MessageType::update_ack, transport::encode(transport::SlotAck{slot}), 0);
  };
  if (u.kind == ChunkKind::momentum) {
    auto fq = fetches_.find(u.name);
    Fetch* f = fq != fetches_.end() && !fq->second.empty() ? &fq->second.front() : nullptr;
    const bool inside = f && u.offset >= 0 &&
                        u.offset + u.count <= static_cast<int64_t>(f->values.size());
    std::byte* dst = inside ? reinterpret_cast<std::byte*>(f->values.data() + u.offset) : nullptr;
    const std::string name = u.name;
    const bool last = u.last;
    const int64_t step = u.step;
    plane_->receive(slot, dst, static_cast<size_t>(u.count) * sizeof(float),
                    transport::DType::f32, [this, ack, name, last, step](std::string error) {
                      ack(error);
                      if (!error.empty() || !last) return;
                      auto q = fetches_.find(name);
                      if (q == fetches_.end() || q->second.empty()) return;
                      Fetch done_fetch = std::move(q->second.front());
                      q->second.pop_front();
                      if (done_fetch.timer) done_fetch.timer->cancel();
                      if (done_fetch.done) {
                        done_fetch.done(std::nullopt, std::move(done_fetch.values), step);
                      }
                    });
    return;
  }
  auto it = receiving_.find(u.name);
  if (it == receiving_.end()) {  // not expected here: received and dropped
    plane_->receive(slot, nullptr, static_cast<size_t>(u.count) * 4, transport::DType::f32, ack);
    return;
  }
  Receiving& r = it->second;
  const size_t esize = transport::dtype_bytes(r.dtype);
  if (u.step != r.step) {
    r.step = u.step;
    r.received = 0;
    r.applied = true;
    r.values = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(r.want.elements()) * esize);
  }
  // Where the chunk lands among the want elements (a packed position may span ranges).
  const auto at = r.want.chunk_position(u.offset, u.count, r.packed);
  const bool in_want = at.has_value();
  const int64_t pos = at.value_or(0);
  std::byte* dst = in_want ? r.values->data() + static_cast<size_t>(pos) * esize : nullptr;
  if (in_want) r.received += u.count;
  r.applied = r.applied && u.applied;
  const bool complete = u.last && r.received == r.want.elements();
  std::function<void(std::string)> done = ack;
  if (complete) {
    // Handed over once its last bytes are in (a plane's receives complete in call order).
    done = [this, ack, name = u.name, step = u.step, applied = r.applied,
            values = r.values](std::string error) {
      ack(error);
      if (error.empty() && events_.update) events_.update(name, step, applied, std::move(*values));
    };
    r.step = -1;
    r.values.reset();
  }
  plane_->receive(slot, dst, static_cast<size_t>(u.count) * esize, r.dtype, std::move(done));
}

// ---- the end -----------------------------------------------------------------------------------

void PeerLink::fail(LinkError why, bool raise_lost) {
  if (failure_) return;
  failure_ = why;
  boost::system::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);
  connect_timer_.cancel();
  if (hello_timer_) hello_timer_->cancel();
  if (stall_timer_) stall_timer_->cancel();
  if (plane_) plane_->abort();
  // writes_ stay: a write in flight may still name its bytes until its handler runs (aborted).
  if (closed_) return;
  auto ops = std::move(ops_);
  auto replies = std::move(replies_);
  auto fetches = std::move(fetches_);
  auto ends = std::move(push_ends_);
  registering_.clear();
  for (auto& op : ops) {
    if (op.done) later([done = std::move(op.done), why] { done(why); });
  }
  for (auto& [id, r] : replies) {
    if (r.timer) r.timer->cancel();
    later([done = std::move(r.done), why] { done(why, {}); });
  }
  for (auto& [name, queue] : fetches) {
    for (auto& f : queue) {
      if (f.timer) f.timer->cancel();
      if (f.done) later([done = std::move(f.done), why] { done(why, {}, -1); });
    }
  }
  for (const auto& end : ends) {
    if (!end->done) continue;
    later([done = std::move(end->done), why] { done(why); });
    end->done = nullptr;
  }
  if (raise_lost && events_.lost) later([this, why] { events_.lost(why); });
}

void PeerLink::abandon(const std::string& why) {
  fail(lost_error(why), /*raise_lost=*/false);
}

void PeerLink::leave() {
  if (closed_) return;
  if (failure_ || !hello_answered_) return close();
  // Silent from now on, as after close(); what is queued and not yet in the socket is dropped
  // (the write in flight, if any, finishes first: its bytes are named by asio until then).
  closed_ = true;
  leaving_ = true;
  ops_.clear();
  replies_.clear();
  fetches_.clear();
  push_ends_.clear();
  if (writing_ && !writes_.empty()) writes_.erase(writes_.begin() + 1, writes_.end());
  else writes_.clear();
  writes_.push_back({transport::encode_frame(transport::Frame{
                         static_cast<uint16_t>(MessageType::goodbye), 0, "{}"}),
                     [this] { fail(lost_error("left the pool session"), /*raise_lost=*/false); },
                     /*when_leaving=*/true});
  if (!writing_) write_next();
}

void PeerLink::close() {
  if (leaving_) return;  // its goodbye is on the way; the socket closes after it
  // events_ stays: this may run inside one of its handlers; closed_ keeps them from running.
  closed_ = true;
  ops_.clear();
  replies_.clear();
  fetches_.clear();
  push_ends_.clear();
  fail(lost_error("closed"), /*raise_lost=*/false);
}

}  // namespace muon::daemon
