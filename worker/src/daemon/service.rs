//! The internal `Daemon` service: hellos, assignments, fetches of cached test results and
//! matches, each handed to the part that handles it.

use super::*;

#[tonic::async_trait]
impl v1::daemon_server::Daemon for Daemon {
    async fn hello(
        &self,
        request: Request<v1::HelloRequest>,
    ) -> Result<Response<v1::HelloResponse>, Status> {
        let theirs = request.into_inner().nonce;
        let ours = self.inner.nonce.load(Ordering::Acquire);
        if theirs != ours {
            self.inner.reregister.notify_one();
        }
        Ok(Response::new(v1::HelloResponse { nonce: ours }))
    }

    async fn assign(
        &self,
        request: Request<v1::AssignRequest>,
    ) -> Result<Response<v1::AssignResponse>, Status> {
        let req = request.into_inner();
        let tx = {
            let mut ws = lock(&self.inner.workers);
            let slot = ws
                .get_mut(&req.worker)
                .ok_or_else(|| ServiceError::NotFound(format!("worker {:x}", req.worker)))?;
            slot.busy = true;
            slot.tx.clone()
        };
        let worker = req.worker;
        if let Err(e) = tx.try_send(req) {
            // not taken: the worker stays idle (the coordinator treats it as gone)
            if let Some(slot) = lock(&self.inner.workers).get_mut(&worker) {
                slot.busy = false;
            }
            return Err(Status::resource_exhausted(format!("worker queue: {e}")));
        }
        Ok(Response::new(v1::AssignResponse {}))
    }

    async fn fetch(
        &self,
        request: Request<v1::FetchRequest>,
    ) -> Result<Response<v1::FetchResponse>, Status> {
        let req = request.into_inner();
        let keys: HashSet<u64> = req.keys.iter().copied().collect();
        let (rs, missing) = self.take_results(req.nonce, &req.tasks, &keys);
        Ok(Response::new(v1::FetchResponse {
            results: rs.iter().map(|r| (**r).clone()).collect(),
            missing,
        }))
    }

    async fn matched(
        &self,
        request: Request<v1::MatchedRequest>,
    ) -> Result<Response<v1::MatchedResponse>, Status> {
        self.handoff(request.into_inner()).await?;
        Ok(Response::new(v1::MatchedResponse {}))
    }
}
