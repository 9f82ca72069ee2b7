//! Element types. Arithmetic runs in f32; integers index; f16 is a storage type on adapters with `shader-f16`.

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: every arithmetic op.
    F32,
    /// 16-bit float: storage and casts (Gpu needs the adapter feature `shader-f16`).
    F16,
    /// Unsigned 32-bit integer: indices and labels.
    U32,
    /// Signed 32-bit integer.
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 => 2,
            _ => 4,
        }
    }

    /// Lower-case name, as in error messages and safetensors headers.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::U32 => "u32",
            DType::I32 => "i32",
        }
    }
}

/// Host element types a tensor can be built from and read back into.
pub trait WithDType: Copy + Send + Sync + 'static + bytemuck::Pod + std::fmt::Debug {
    /// The matching [`DType`].
    const DTYPE: DType;
}

impl WithDType for f32 {
    const DTYPE: DType = DType::F32;
}
impl WithDType for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl WithDType for u32 {
    const DTYPE: DType = DType::U32;
}
impl WithDType for i32 {
    const DTYPE: DType = DType::I32;
}
