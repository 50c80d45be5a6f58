//! The codec every dissem service uses: prost, except that a request that fails to decode
//! (garbage bytes, truncated messages, invalid UTF-8 in a string field) is answered with
//! `InvalidArgument` naming the message and field prost reports, instead of `Internal`:
//! it is the caller's input that is wrong, not the server.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// Prost encoding with client-error decoding failures.
#[derive(Debug, Clone)]
pub struct DissemCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for DissemCodec<T, U> {
    fn default() -> Self {
        DissemCodec(PhantomData)
    }
}

impl<T, U> Codec for DissemCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = InvalidArgumentDecoder<<ProstCodec<T, U> as Codec>::Decoder>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// Wraps a decoder, turning its decode failures into `InvalidArgument`.
#[derive(Debug)]
pub struct InvalidArgumentDecoder<D>(D);

impl<D: Decoder<Error = Status>> Decoder for InvalidArgumentDecoder<D> {
    type Item = D::Item;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        self.0.decode(buf).map_err(|s| {
            if s.code() == Code::Internal {
                Status::invalid_argument(format!("malformed request: {}", s.message()))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
