//! RDMA ports as the verbs library reports them, and the decode of a port's active speed
//! and width into the Gb/s a vendor quotes (NDR 400, HDR 200): what `strata probe` turns
//! into `cluster.nic_gbps`.
//!
//! The encodings are those of `ibv_query_port(3)`'s `active_speed` / `active_speed_ex` and
//! `active_width`, which carry the InfiniBand Architecture Specification's PortInfo
//! `LinkSpeedActive` / `LinkSpeedExtActive` / `LinkWidthActive`. The table below follows
//! rdma-core's own decoder, `libibverbs/examples/devinfo.c` (`speed_str`, `width_str`;
//! rdma-core v55, the version the ibverbs crate vendors): the per-lane data rate in Gb/s and
//! the number of lanes. A link's rate is their product (4x NDR = 4 · 100 = 400 Gb/s). For
//! RoCE ports the driver reports the Ethernet speed in the same encoding (200GbE as 4x HDR).
//!
//! The ports themselves are read through the ibverbs crate's bindings (ibverbs-sys) behind
//! the `ibverbs` feature; without it, or without an RDMA device, the reason is a value.

use serde::Serialize;

/// One lane's data rate (Gb/s) for an `active_speed` / `active_speed_ex` code, with the
/// InfiniBand generation's name; `None` for a code the specification does not define.
pub fn lane_gbps(code: u32) -> Option<(f64, &'static str)> {
    Some(match code {
        1 => (2.5, "SDR"),
        2 => (5.0, "DDR"),
        4 => (10.0, "QDR"),
        // FDR10: 10.3125 Gbaud with 64b/66b coding, 10 Gb/s of data (devinfo.c prints 10.0).
        8 => (10.0, "FDR10"),
        16 => (14.0, "FDR"),
        32 => (25.0, "EDR"),
        64 => (50.0, "HDR"),
        128 => (100.0, "NDR"),
        256 => (200.0, "XDR"),
        _ => return None,
    })
}

/// Lanes for an `active_width` code; `None` for a code the specification does not define.
pub fn lanes(code: u8) -> Option<u32> {
    Some(match code {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => return None,
    })
}

/// A port's rate in Gb/s (lanes × lane rate), or `None` when a code is not defined.
/// `speed_ex` is `active_speed_ex` (rdma-core ≥ 44; 0 when the device reports only
/// `active_speed`), which takes precedence as in devinfo.c.
pub fn port_gbps(speed: u8, speed_ex: u32, width: u8) -> Option<f64> {
    let code = if speed_ex != 0 { speed_ex } else { u32::from(speed) };
    Some(lane_gbps(code)?.0 * f64::from(lanes(width)?))
}

/// The link layer of a port (`ibv_port_attr.link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_INFINIBAND` (or unspecified, which verbs treats as InfiniBand).
    InfiniBand,
    /// `IBV_LINK_LAYER_ETHERNET`: RoCE.
    Ethernet,
}

impl LinkLayer {
    pub fn from_code(code: u8) -> LinkLayer {
        if code == 2 { LinkLayer::Ethernet } else { LinkLayer::InfiniBand }
    }

    pub fn label(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "RoCE (Ethernet)",
        }
    }
}

/// A port's state (`enum ibv_port_state`).
pub fn state_label(code: u32) -> &'static str {
    match code {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

/// One port of one RDMA device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RdmaPort {
    /// The verbs device name (`mlx5_0`).
    pub device: String,
    /// Port number, from 1.
    pub port: u8,
    /// `ibv_port_state` code (4 = ACTIVE).
    pub state: u32,
    pub link_layer: LinkLayer,
    /// The raw codes, as read.
    pub active_speed: u8,
    pub active_speed_ex: u32,
    pub active_width: u8,
    /// Lanes × lane rate, when both codes are defined.
    pub gbps: Option<f64>,
}

impl RdmaPort {
    pub fn active(&self) -> bool {
        self.state == 4
    }

    /// `mlx5_0 port 1: ACTIVE, InfiniBand, 4x NDR = 400 Gb/s`.
    pub fn describe(&self) -> String {
        let code = if self.active_speed_ex != 0 { self.active_speed_ex } else { u32::from(self.active_speed) };
        let rate = match (lanes(self.active_width), lane_gbps(code)) {
            (Some(l), Some((g, name))) => format!("{l}x {name} = {} Gb/s", g * f64::from(l)),
            _ => format!("speed code {code}, width code {} (not in the IB specification's table)", self.active_width),
        };
        format!("{} port {}: {}, {}, {rate}", self.device, self.port, state_label(self.state), self.link_layer.label())
    }
}

/// Every port of every RDMA device, or why there are none to list: built without the
/// `ibverbs` feature, no verbs support in the kernel, or no device.
pub fn ports() -> Result<Vec<RdmaPort>, String> {
    #[cfg(feature = "ibverbs")]
    {
        verbs::ports()
    }
    #[cfg(not(feature = "ibverbs"))]
    {
        Err("built without ibverbs: RDMA devices are read by a build with `--features ibverbs` \
             (it needs libibverbs-dev)"
            .into())
    }
}

#[cfg(feature = "ibverbs")]
mod verbs {
    //! The verbs calls: the device list, then each device's ports.
    use super::{LinkLayer, RdmaPort, port_gbps};
    use ibverbs_sys as ffi;

    pub fn ports() -> Result<Vec<RdmaPort>, String> {
        let mut n = 0i32;
        // SAFETY: ibv_get_device_list writes the count and returns a NULL-terminated array
        // we free below (or NULL with errno set).
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "no RDMA device: the verbs library lists none ({e}; is there an RDMA NIC and driver?)"
            ));
        }
        let mut out = Vec::new();
        let mut failure = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n, the array's length.
            let dev = unsafe { *list.add(i) };
            match device_ports(dev) {
                Ok(p) => out.extend(p),
                Err(e) => failure = Some(e),
            }
        }
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(list) };
        if let Some(e) = failure.filter(|_| out.is_empty()) {
            return Err(e);
        }
        if out.is_empty() {
            return Err("no RDMA device: the verbs library lists no device".into());
        }
        Ok(out)
    }

    fn device_ports(dev: *mut ffi::ibv_device) -> Result<Vec<RdmaPort>, String> {
        // SAFETY: dev is an entry of a live device list; the name is a NUL-terminated array.
        let name = unsafe { std::ffi::CStr::from_ptr(ffi::ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
        // SAFETY: as above; the context is closed before returning.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(format!("opening RDMA device {name}: {}", std::io::Error::last_os_error()));
        }
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: ctx is open; attr is a valid out-parameter.
        let rc = unsafe { ffi::ibv_query_device(ctx, &mut attr) };
        let mut out = Vec::new();
        let mut result = Ok(());
        if rc != 0 {
            result = Err(format!("querying RDMA device {name}: {}", std::io::Error::from_raw_os_error(rc)));
        }
        for port in 1..=attr.phys_port_cnt {
            let mut p = ffi::ibv_port_attr::default();
            // SAFETY: ctx is open, port is in 1..=phys_port_cnt, p is a valid out-parameter
            // (the binding takes the compat struct; the layout is the same, as the ibverbs
            // crate's own call relies on).
            let rc = unsafe { ffi::ibv_query_port(ctx, port, &mut p as *mut ffi::ibv_port_attr as *mut _) };
            if rc != 0 {
                result = Err(format!("querying port {port} of {name}: {}", std::io::Error::from_raw_os_error(rc)));
                continue;
            }
            out.push(RdmaPort {
                device: name.clone(),
                port,
                state: p.state,
                link_layer: LinkLayer::from_code(p.link_layer),
                active_speed: p.active_speed,
                active_speed_ex: p.active_speed_ex,
                active_width: p.active_width,
                gbps: port_gbps(p.active_speed, p.active_speed_ex, p.active_width),
            });
        }
        // SAFETY: ctx was opened above and is closed once.
        unsafe { ffi::ibv_close_device(ctx) };
        result.map(|()| out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generations as vendors quote 4x links (NDR 400, HDR 200, EDR 100, FDR 56,
    /// QDR 40), HDR100 as 2x HDR, and codes outside the table.
    #[test]
    fn speed_and_width_codes_decode_to_the_quoted_rates() {
        for (speed, gbps) in
            [(1u8, 10.0), (2, 20.0), (4, 40.0), (8, 40.0), (16, 56.0), (32, 100.0), (64, 200.0), (128, 400.0)]
        {
            assert_eq!(port_gbps(speed, 0, 2), Some(gbps), "speed code {speed}, 4x");
        }
        // XDR exists only as active_speed_ex (the 8-bit field cannot hold 256).
        assert_eq!(port_gbps(0, 256, 2), Some(800.0));
        // active_speed_ex wins over active_speed, as in devinfo.c.
        assert_eq!(port_gbps(64, 128, 2), Some(400.0));
        assert_eq!(port_gbps(64, 0, 16), Some(100.0), "HDR100: 2x HDR");
        assert_eq!(port_gbps(128, 0, 1), Some(100.0), "1x NDR");
        assert_eq!(port_gbps(32, 0, 8), Some(300.0), "12x EDR");
        assert_eq!(port_gbps(128, 0, 4), Some(800.0), "8x NDR");
        assert_eq!(port_gbps(3, 0, 2), None, "3 is not a speed code");
        assert_eq!(port_gbps(128, 0, 3), None, "3 is not a width code");
        assert_eq!(port_gbps(0, 0, 2), None);
    }

    #[test]
    fn a_port_describes_itself() {
        let p = RdmaPort {
            device: "mlx5_0".into(),
            port: 1,
            state: 4,
            link_layer: LinkLayer::from_code(1),
            active_speed: 128,
            active_speed_ex: 0,
            active_width: 2,
            gbps: port_gbps(128, 0, 2),
        };
        assert_eq!(p.describe(), "mlx5_0 port 1: ACTIVE, InfiniBand, 4x NDR = 400 Gb/s");
        let down = RdmaPort { state: 1, link_layer: LinkLayer::from_code(2), active_width: 0, gbps: None, ..p };
        assert!(!down.active());
        assert!(
            down.describe().contains("DOWN, RoCE") && down.describe().contains("not in the IB"),
            "{}",
            down.describe()
        );
    }

    #[cfg(not(feature = "ibverbs"))]
    #[test]
    fn without_the_feature_ports_say_why() {
        assert!(ports().unwrap_err().contains("built without ibverbs"));
    }

    /// A machine without RDMA devices (CI: no uverbs in the kernel) gets the reason.
    #[cfg(feature = "ibverbs")]
    #[test]
    fn without_a_device_ports_say_so() {
        if std::path::Path::new("/sys/class/infiniband").exists() {
            return; // an RDMA machine: `strata probe` there lists its ports
        }
        let e = ports().unwrap_err();
        assert!(e.starts_with("no RDMA device"), "{e}");
    }
}
