#include "mesh/cohort_carrier.h"

#include <utility>

#include "util/transit.h"

namespace meshnet::mesh {

// A step waiting in the queue or being carried. Lives on its caller's stack;
// the leader writes `out` and then sets `done` under mu_.
struct CohortCarrier::Member {
  explicit Member(Mutex* mu) : wake(mu) {}
  const Route* route = nullptr;
  Carried out;  // out.request: the request for out.hop while carried
  bool done = false;
  bool answered = false;  // reached the tail's output (counted in transit)
  CondVar wake;           // done, or this member is the queue's front
};

namespace {

bool SameHops(const Route& a, const Route& b) {
  if (a.hops.size() != b.hops.size()) return false;
  for (size_t i = 0; i < a.hops.size(); ++i) {
    if (a.hops[i].get() != b.hops[i].get()) return false;
  }
  return true;
}

}  // namespace

int64_t CohortCarrier::waiting() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void CohortCarrier::TakeCohortLocked(std::vector<Member*>* cohort) {
  carrying_ = true;
  const Route& route = *queue_.front()->route;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (SameHops(*(*it)->route, route)) {
      cohort->push_back(*it);
      it = queue_.erase(it);
    } else {
      ++it;  // another route: the next cohort
    }
  }
}

void CohortCarrier::Lead(const std::vector<Member*>& cohort) {
  const Route& route = *cohort.front()->route;
  std::vector<Member*> going = cohort;
  std::vector<StepRequest> requests;
  for (size_t hop = 0; hop < route.hops.size() && !going.empty(); ++hop) {
    requests.clear();
    for (Member* m : going) requests.push_back(m->out.request);
    std::vector<GroupAnswer> answers = route.hops[hop]->StepGroup(requests);
    std::vector<Member*> next;
    for (size_t j = 0; j < going.size(); ++j) {
      Member& m = *going[j];
      GroupAnswer& a = answers[j];
      m.out.hop = hop;
      auto* bundle = a.result ? std::get_if<shard::BoundaryBundle>(&*a.result) : nullptr;
      if (bundle != nullptr && hop + 1 < route.hops.size()) {  // on to the next hop
        m.out.request.token_ids.clear();
        m.out.request.bundle = std::move(*bundle);
        next.push_back(&m);
        continue;
      }
      m.answered = a.result && std::holds_alternative<shard::TailOutput>(*a.result);
      m.out.result = std::move(a.result);
      m.out.error = std::move(a.error);
    }
    going = std::move(next);
  }
}

CohortCarrier::Carried CohortCarrier::Carry(const Route& route, StepRequest first) {
  Member self(&mu_);
  self.route = &route;
  self.out.request = std::move(first);
  std::vector<Member*> cohort;
  {
    MutexLock lock(&mu_);
    queue_.push_back(&self);
    util::Transit::Get().Clear();  // queued: a leader waiting for it can go
    while (!self.done && (carrying_ || queue_.front() != &self)) self.wake.Wait();
    if (!self.done) carrying_ = true;  // this thread leads; the others queue meanwhile
  }
  if (!self.done) {
    util::Transit::Get().Wait(transit_wait_s_);
    {
      MutexLock lock(&mu_);
      TakeCohortLocked(&cohort);
    }
    try {
      Lead(cohort);
    } catch (...) {  // no memory for a request: the steps still going fail with it
      for (Member* m : cohort) {
        if (!m->out.result && !m->out.error) m->out.error = std::current_exception();
      }
    }
    int64_t answered = 0;
    for (Member* m : cohort) answered += m->answered;
    util::Transit::Get().Count(answered);  // before they wake: they go on to their next step
    MutexLock lock(&mu_);
    carrying_ = false;
    for (Member* m : cohort) {
      m->done = true;
      m->wake.Signal();
    }
    if (!queue_.empty()) queue_.front()->wake.Signal();  // it leads next
  }
  if (self.answered) util::Transit::Get().Adopt();
  return std::move(self.out);
}

}  // namespace meshnet::mesh
